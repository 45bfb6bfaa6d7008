"""Inference backend clients: vllm, sglang, openai (retokenized) and scripted."""
