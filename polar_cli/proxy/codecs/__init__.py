"""Provider codecs (one module per protocol) and detection by path, then headers."""
