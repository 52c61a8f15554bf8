"""vkv: compress a coding agent's conversation at the model's own representation layer.

The public API, imported on first use (so `import vkv` stays light):

    cache = vkv.compress(model, tokenizer, messages, method="kvzip", ratio=8.0)   # any transformers causal LM
    model.generate(ids, past_key_values=cache)                # ids: the whole conversation's, then the new ones
    lm = vkv.load_model("smollm2-135m")                       # a FrozenLM
    spliced = vkv.compress_span(lm, ids, start, end, 3.2, vkv.CompressConfig())    # at 3.2 span tokens per entry
    vkv.save_cache(spliced, "c.safetensors"); vkv.load_cache("c.safetensors", lm)
    cache = lm.ragged_cache(spliced)                          # a transformers Cache for model.generate()
    session = vkv.Session(lm)                                 # append, compress, ask, save, Session.load
    messages = vkv.load_conversation("chat.json")             # an OpenAI, Anthropic, JSON-lines or vkv conversation
    record = vkv.score(model, tokenizer, messages, method="kvzip", ratio=8.0)  # record["summary"]["kept"]: no questions
"""

from importlib import import_module
from inspect import getdoc, signature
from types import ModuleType

from vkv.version import __version__


class _CallablePackage(ModuleType):
    """The package `vkv.compress` (an empty `__init__`, so importing it costs nothing), callable as the function
    `vkv.api.compress.compress`: a plain function named `compress` here would be replaced by the subpackage as
    soon as any of its modules is imported."""

    def __call__(self, *args, **kwargs):
        return import_module("vkv.api.compress").compress(*args, **kwargs)

    # help() and inspect show the function's parameters and documentation, not (*args, **kwargs); read when asked,
    # so that `import vkv` still imports nothing heavy
    @property
    def __signature__(self):
        return signature(import_module("vkv.api.compress").compress)

    @property
    def __doc__(self):
        function = import_module("vkv.api.compress").compress
        return f"compress{signature(function)}\n\n{getdoc(function)}\n\n{_PACKAGE_DOC}"


_PACKAGE_DOC = import_module("vkv.compress").__doc__
import_module("vkv.compress").__class__ = _CallablePackage

_API = {
    "load_model": "vkv.lm.load",
    "model_path": "vkv.lm.zoo",
    "FrozenLM": "vkv.lm.frozen",
    "CompressConfig": "vkv.compress.config",
    "OptimConfig": "vkv.compress.optimise",
    "VkvRecipe": "vkv.compress.sequential",
    "compress_span": "vkv.compress.span",
    "compress_transcript": "vkv.compress.span",
    "Session": "vkv.api.session",
    "SplicedCache": "vkv.kv.spliced",
    "RaggedCache": "vkv.kv.ragged",
    "use_ragged_attention": "vkv.lm.ragged_attention",
    "generate": "vkv.lm.generate",
    "Segment": "vkv.kv.segment",
    "save_cache": "vkv.kv.file",
    "load_cache": "vkv.lm.rebuild",
    "load_transcript": "vkv.text.transcript",
    "load_conversation": "vkv.text.formats",
    "get_method": "vkv.methods",
    "score": "vkv.evals.score",
}
__all__ = ["__version__", "compress", *_API]


def __getattr__(name: str):
    if name in _API:
        return getattr(import_module(_API[name]), name)
    raise AttributeError(f"module 'vkv' has no attribute {name!r}")
