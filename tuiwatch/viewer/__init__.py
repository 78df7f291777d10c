"""The viewer: a Textual app fed by a source. Textual yes, torch never."""

# Frames a second at most (a frame is drawn only when something changed). 4, not 10: at 10 a viewer beside a
# 700-step/s run took 21 % of a core and cost the training ~2 % (bench/viewer_cost.py); at 4, 9.5 % and nothing
# measurable. A record then waits up to 250 ms for the screen; --fps 10 trades that back. Here, not in app.py:
# the CLI reads it without importing Textual.
DEFAULT_FPS = 4.0
