"""Where users already train: a Watch fitted to loops tuiwatch did not write (torch, never Textual)."""
