"""vkv's compression algorithms. The package is also callable: `vkv.compress(model, tokenizer, messages, method=...,
ratio=...)` is `vkv.api.compress.compress` (`vkv/__init__.py` makes it so)."""
