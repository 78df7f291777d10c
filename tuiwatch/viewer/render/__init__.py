"""Drawing maths for the viewer: pure functions over numbers, tested as strings. No Textual."""
