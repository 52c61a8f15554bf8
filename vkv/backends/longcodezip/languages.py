"""How this backend reads each language: the language of a file or a markdown fence, and the tree-sitter
node roles the syntax walker (syntax.py) splits code by.

Names, extensions, comment syntax and grammars are the shared table's (vkv.backends.source.languages). A
language with a grammar is split along its syntax tree; one without is split into paragraphs and lines.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from vkv.backends.source.languages import LANGUAGES, Language, find_language, language_of_path, lookup_language


@dataclass(frozen=True)
class NodeRoles:
    """Which tree-sitter node types play which part, for one grammar."""

    containers: frozenset[str]  # nodes whose children are separately removable statements
    functions: frozenset[str]
    classes: frozenset[str]  # definitions whose members may become chunks of their own
    transparent: frozenset[str] = frozenset()  # wrappers inside a container whose children count instead
    wrappers: frozenset[str] = frozenset()  # export / decorator / template nodes around a definition
    comments: frozenset[str] = frozenset({"comment"})
    attached: frozenset[str] = frozenset()  # siblings that belong to the next definition (attributes)
    not_container_under: frozenset[tuple[str, str]] = frozenset()  # (child, parent) pairs to skip
    empty_body_needs_statement: bool = False  # Python: a block must hold a statement, a comment is not one


_JS = NodeRoles(
    containers=frozenset(
        {"statement_block", "class_body", "switch_body", "switch_case", "switch_default", "interface_body", "enum_body"}
    ),
    functions=frozenset(
        {
            "function_declaration",
            "generator_function_declaration",
            "function_expression",
            "function",
            "generator_function",
            "arrow_function",
            "method_definition",
            "function_signature",
        }
    ),
    classes=frozenset(
        {
            "class_declaration",
            "class",
            "abstract_class_declaration",
            "interface_declaration",
            "internal_module",
            "module",
        }
    ),
    wrappers=frozenset({"export_statement"}),
)
_C = NodeRoles(
    containers=frozenset(
        {
            "compound_statement",
            "field_declaration_list",
            "declaration_list",
            "enumerator_list",
            "preproc_if",
            "preproc_ifdef",
            "preproc_else",
            "preproc_elif",
        }
    ),
    functions=frozenset({"function_definition"}),
    classes=frozenset({"struct_specifier", "union_specifier"}),
    wrappers=frozenset({"template_declaration", "linkage_specification"}),
)

NODE_ROLES: dict[str, NodeRoles] = {
    "python": NodeRoles(
        containers=frozenset({"block"}),
        functions=frozenset({"function_definition"}),
        classes=frozenset({"class_definition"}),
        wrappers=frozenset({"decorated_definition"}),
        not_container_under=frozenset({("block", "match_statement")}),
        empty_body_needs_statement=True,
    ),
    "javascript": _JS,
    "typescript": _JS,
    "tsx": _JS,
    "java": NodeRoles(
        containers=frozenset(
            {
                "block",
                "class_body",
                "interface_body",
                "enum_body",
                "constructor_body",
                "annotation_type_body",
                "switch_block",
                "switch_block_statement_group",
            }
        ),
        functions=frozenset({"method_declaration", "constructor_declaration", "compact_constructor_declaration"}),
        classes=frozenset(
            {
                "class_declaration",
                "interface_declaration",
                "enum_declaration",
                "record_declaration",
                "annotation_type_declaration",
            }
        ),
        comments=frozenset({"line_comment", "block_comment"}),
    ),
    "go": NodeRoles(
        containers=frozenset(
            {
                "block",
                "field_declaration_list",
                "interface_type",
                "expression_switch_statement",
                "type_switch_statement",
                "select_statement",
                "expression_case",
                "default_case",
                "type_case",
                "communication_case",
            }
        ),
        transparent=frozenset({"statement_list"}),
        functions=frozenset({"function_declaration", "method_declaration", "func_literal"}),
        classes=frozenset({"type_declaration"}),
    ),
    "rust": NodeRoles(
        containers=frozenset(
            {"block", "declaration_list", "field_declaration_list", "match_block", "enum_variant_list"}
        ),
        functions=frozenset({"function_item", "function_signature_item", "closure_expression"}),
        classes=frozenset({"impl_item", "trait_item", "mod_item", "struct_item", "enum_item", "union_item"}),
        comments=frozenset({"line_comment", "block_comment"}),
        attached=frozenset({"attribute_item"}),
    ),
    "c": _C,
    "cpp": replace(
        _C, classes=frozenset({"class_specifier", "struct_specifier", "union_specifier", "namespace_definition"})
    ),
}


def detect_language(path: str | Path, override: str | None = None) -> Language:
    """The override if given, else the language that owns the file's extension, else plain text."""
    if override:
        return lookup_language(override)
    return language_of_path(path) or LANGUAGES["text"]


def fence_language(info: str) -> Language | None:
    """The language named on a markdown fence line (```python …), or None when unknown or absent."""
    words = info.split(maxsplit=1)
    return find_language(words[0].strip("{}.")) if words else None
