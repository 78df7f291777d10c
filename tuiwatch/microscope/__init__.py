"""Tools to look closely at one batch and one model, off the training loop (torch, no Textual)."""
