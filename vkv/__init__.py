"""vkv: compress a coding agent's conversation at the model's own representation layer."""

__version__ = "0.1.0"
