"""LongCodeZip (arXiv 2510.00446) as a vkv text backend, rebuilt from the paper with the public
implementation's faults fixed: tree-sitter chunks, AMI in bits from batched passes, one forward pass
per chunk for line scores, an exact knapsack, and a budget that caps the rendered output.

Files, in pipeline order: languages.py (a file's language, tree-sitter node roles) · units.py,
document.py, syntax.py, prose.py (the unit tree: what can be removed without breaking syntax) ·
chunking.py (coarse chunks) · tokens.py, scoring.py (the model: AMI and line NLLs) · budget.py (greedy
chunk selection, adaptive ratios) · blocks.py (perplexity spikes) · knapsack.py · fine.py (the fine
stage per chunk) · closure.py, render.py (syntax repair, placeholders) · pruner.py (`LongCodeZip`, the
TextPruner) · settings.py · source.py (reading a file) · cli.py (what `vkv prune` calls). The language
table, line splitting and placeholder text are shared with lamr in vkv.backends.source.
"""

from vkv.backends.longcodezip.languages import detect_language
from vkv.backends.longcodezip.pruner import LongCodeZip
from vkv.backends.longcodezip.settings import LongCodeZipSettings
from vkv.backends.longcodezip.source import read_source
from vkv.backends.source.languages import LANGUAGES, lookup_language

__all__ = ["LANGUAGES", "LongCodeZip", "LongCodeZipSettings", "detect_language", "lookup_language", "read_source"]
