"""vkv's compression algorithms. The package is also callable: `vkv.compress(model, tokenizer, messages, method=...,
ratio=...)` is `vkv.compress_api.compress` (`vkv/__init__.py` makes it so)."""
