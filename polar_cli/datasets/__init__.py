"""Built-in datasets that need more than a few lines: ``demo`` (offline coding tasks) and ``hf`` (HuggingFace)."""
