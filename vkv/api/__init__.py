"""The Python API a user calls: `vkv.compress` (any KV method on a plain transformers model) and `vkv.Session` (a
conversation compressed as it grows). It sits on the methods and below the eval harness, which builds on it."""
