"""One widget per pane: data in as attributes (``show``), no sockets or files inside."""
