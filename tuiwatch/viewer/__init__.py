"""The viewer: a Textual app fed by a source. Textual yes, torch never."""

# Frames a second at most (a frame is drawn only when something changed). 4, not 10: at 10 a viewer beside a
# 700-step/s run took 21 % of a core and cost the training ~2 % (bench/viewer_cost.py); at 4, 9.5 % and nothing
# measurable. A record then waits up to 250 ms for the screen; --fps 10 trades that back. Here, not in app.py:
# the CLI reads it without importing Textual.
DEFAULT_FPS = 4.0

# What ``e`` cycles the loss's moving average through (0: off), as TensorBoard's smoothing; the config file's
# ``smoothing`` is one of them.
SMOOTHING = (0.0, 0.6, 0.9, 0.99)
# ``--theme`` and the config file's ``theme``: Textual's theme for each (ansi: the terminal's own 16 colours;
# ascii: those, and no character outside ASCII: no braille, no box drawing).
THEMES = {"dark": "textual-dark", "light": "textual-light", "ansi": "ansi-dark", "ascii": "ansi-dark"}
