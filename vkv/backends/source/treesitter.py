"""Tree-sitter parsers for the languages in languages.py that have a grammar, loaded once per language.

Grammar wheels are imported on first use, so a backend that never meets Go never imports tree_sitter_go.
"""

from __future__ import annotations

import importlib
from functools import cache

from vkv.backends.source.languages import LANGUAGES, find_language
from vkv.errors import VkvError


@cache
def parser_for(name: str):
    """A tree-sitter parser for the language called `name` (canonical, as in LANGUAGES), or None when it
    has no grammar or its wheel (or tree-sitter itself) is not installed."""
    language = LANGUAGES.get(name)
    if language is None or language.grammar is None:
        return None
    module_name, function_name = language.grammar
    try:
        # optional: without tree-sitter or the grammar's wheel the language has no parser (None), not an error
        import tree_sitter

        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return tree_sitter.Parser(tree_sitter.Language(getattr(module, function_name)()))


def require_parser(name: str):
    """parser_for, with a VkvError saying what to install instead of None."""
    parser = parser_for(name)
    grammar = LANGUAGES[name].grammar
    if grammar is None:
        raise VkvError(f"language '{name}' has no tree-sitter grammar in vkv")
    if parser is None:
        raise VkvError(f"the {name} grammar is not installed; pip install {grammar[0].replace('_', '-')}")
    return parser


def grammar_installed(name: str | None) -> bool:
    """Whether `name` (or an alias of it) can be parsed here."""
    language = find_language(name)
    return language is not None and parser_for(language.name) is not None
