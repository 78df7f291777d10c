"""The viewer: a Textual app fed by a source. Textual yes, torch never."""
