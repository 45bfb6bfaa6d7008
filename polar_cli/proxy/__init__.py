"""The gateway proxy: provider codecs, synthetic streaming, token capture, inference backends."""
