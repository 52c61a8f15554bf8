"""Which languages the backend understands: file extensions, comment syntax, and tree-sitter node roles.

A language with a grammar is split along its syntax tree; one without (plain text, markdown, shell, …)
is split into paragraphs and lines. Every language knows how to write a placeholder comment.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from vkv.errors import VkvError


@dataclass(frozen=True)
class LanguageSpec:
    """What the chunker and the renderer need to know about one language."""

    name: str
    extensions: tuple[str, ...]
    comment: tuple[str, str]  # (opening, closing) of a one-line comment; closing may be ""
    grammar: tuple[str, str] | None = None  # (python module, function returning the language pointer)
    containers: frozenset[str] = frozenset()  # nodes whose children are separately removable statements
    transparent: frozenset[str] = frozenset()  # wrappers inside a container whose children count instead
    functions: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()  # definitions whose members may become chunks of their own
    wrappers: frozenset[str] = frozenset()  # export / decorator / template nodes around a definition
    comments: frozenset[str] = frozenset({"comment"})
    attached: frozenset[str] = frozenset()  # siblings that belong to the next definition (attributes)
    not_container_under: frozenset[tuple[str, str]] = frozenset()  # (child, parent) pairs to skip
    empty_body_needs_statement: bool = False  # Python: a block must hold a statement, a comment is not one

    @property
    def has_grammar(self) -> bool:
        return self.grammar is not None

    def placeholder(self, omitted_lines: int) -> str:
        noun = "line" if omitted_lines == 1 else "lines"
        opening, closing = self.comment
        body = f"{opening} … {omitted_lines} {noun} omitted"
        return f"{body} {closing}" if closing else body


_JS_CONTAINERS = frozenset(
    {"statement_block", "class_body", "switch_body", "switch_case", "switch_default", "interface_body", "enum_body"}
)
_JS_FUNCTIONS = frozenset(
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
)
_JS_CLASSES = frozenset(
    {"class_declaration", "class", "abstract_class_declaration", "interface_declaration", "internal_module", "module"}
)
_C_CONTAINERS = frozenset(
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
)


def _js_like(name: str, extensions: tuple[str, ...], grammar: tuple[str, str]) -> LanguageSpec:
    return LanguageSpec(
        name=name,
        extensions=extensions,
        comment=("//", ""),
        grammar=grammar,
        containers=_JS_CONTAINERS,
        functions=_JS_FUNCTIONS,
        classes=_JS_CLASSES,
        wrappers=frozenset({"export_statement"}),
    )


def _c_like(name: str, extensions: tuple[str, ...], grammar: tuple[str, str], classes: frozenset[str]) -> LanguageSpec:
    return LanguageSpec(
        name=name,
        extensions=extensions,
        comment=("//", ""),
        grammar=grammar,
        containers=_C_CONTAINERS,
        functions=frozenset({"function_definition"}),
        classes=classes,
        wrappers=frozenset({"template_declaration", "linkage_specification"}),
    )


_SPECS = [
    LanguageSpec(
        name="python",
        extensions=(".py", ".pyi", ".pyw"),
        comment=("#", ""),
        grammar=("tree_sitter_python", "language"),
        containers=frozenset({"block"}),
        functions=frozenset({"function_definition"}),
        classes=frozenset({"class_definition"}),
        wrappers=frozenset({"decorated_definition"}),
        not_container_under=frozenset({("block", "match_statement")}),
        empty_body_needs_statement=True,
    ),
    _js_like("javascript", (".js", ".jsx", ".mjs", ".cjs"), ("tree_sitter_javascript", "language")),
    _js_like("typescript", (".ts", ".mts", ".cts"), ("tree_sitter_typescript", "language_typescript")),
    _js_like("tsx", (".tsx",), ("tree_sitter_typescript", "language_tsx")),
    LanguageSpec(
        name="java",
        extensions=(".java",),
        comment=("//", ""),
        grammar=("tree_sitter_java", "language"),
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
    LanguageSpec(
        name="go",
        extensions=(".go",),
        comment=("//", ""),
        grammar=("tree_sitter_go", "language"),
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
    LanguageSpec(
        name="rust",
        extensions=(".rs",),
        comment=("//", ""),
        grammar=("tree_sitter_rust", "language"),
        containers=frozenset(
            {"block", "declaration_list", "field_declaration_list", "match_block", "enum_variant_list"}
        ),
        functions=frozenset({"function_item", "function_signature_item", "closure_expression"}),
        classes=frozenset({"impl_item", "trait_item", "mod_item", "struct_item", "enum_item", "union_item"}),
        comments=frozenset({"line_comment", "block_comment"}),
        attached=frozenset({"attribute_item"}),
    ),
    _c_like("c", (".c", ".h"), ("tree_sitter_c", "language"), frozenset({"struct_specifier", "union_specifier"})),
    _c_like(
        "cpp",
        (".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx", ".h++", ".ipp"),
        ("tree_sitter_cpp", "language"),
        frozenset({"class_specifier", "struct_specifier", "union_specifier", "namespace_definition"}),
    ),
    # Languages without a grammar here: split into paragraphs and lines, placeholders in their syntax.
    LanguageSpec(name="text", extensions=(".txt", ".log", ""), comment=("<!--", "-->")),
    LanguageSpec(name="markdown", extensions=(".md", ".markdown", ".rst"), comment=("<!--", "-->")),
    LanguageSpec(name="html", extensions=(".html", ".htm", ".xml", ".svg", ".vue"), comment=("<!--", "-->")),
    LanguageSpec(name="shell", extensions=(".sh", ".bash", ".zsh"), comment=("#", "")),
    LanguageSpec(name="yaml", extensions=(".yaml", ".yml", ".toml", ".ini", ".cfg"), comment=("#", "")),
    LanguageSpec(name="ruby", extensions=(".rb",), comment=("#", "")),
    LanguageSpec(name="sql", extensions=(".sql",), comment=("--", "")),
    LanguageSpec(name="css", extensions=(".css", ".scss", ".less"), comment=("/*", "*/")),
    *(
        LanguageSpec(name=name, extensions=extensions, comment=("//", ""))
        for name, extensions in (
            ("kotlin", (".kt", ".kts")),
            ("scala", (".scala",)),
            ("swift", (".swift",)),
            ("csharp", (".cs",)),
            ("php", (".php",)),
        )
    ),
]
LANGUAGES: dict[str, LanguageSpec] = {spec.name: spec for spec in _SPECS}

# Names people write after a markdown fence or on the command line.
_ALIASES = {
    "py": "python",
    "python3": "python",
    "js": "javascript",
    "jsx": "javascript",
    "node": "javascript",
    "ts": "typescript",
    "golang": "go",
    "rs": "rust",
    "h": "c",
    "c++": "cpp",
    "cc": "cpp",
    "cxx": "cpp",
    "hpp": "cpp",
    "md": "markdown",
    "txt": "text",
    "plain": "text",
    "plaintext": "text",
    "console": "shell",
    "sh": "shell",
    "bash": "shell",
    "zsh": "shell",
    "yml": "yaml",
    "toml": "yaml",
    "xml": "html",
}


def lookup_language(name: str) -> LanguageSpec:
    """A language by name or common alias; a VkvError lists the known names otherwise."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in LANGUAGES:
        raise VkvError(f"unknown language '{name}'; known languages: {', '.join(sorted(LANGUAGES))}")
    return LANGUAGES[key]


def fence_language(info: str) -> LanguageSpec | None:
    """The language named on a markdown fence line (```python …), or None when unknown or absent."""
    word = info.strip().split(maxsplit=1)[0] if info.strip() else ""
    word = word.strip("{}.").lower()
    if not word:
        return None
    try:
        return lookup_language(word)
    except VkvError:
        return None


def detect_language(path: str | Path, override: str | None = None) -> LanguageSpec:
    """The override if given, else the language that owns the file's extension, else plain text."""
    if override:
        return lookup_language(override)
    suffix = Path(path).suffix.lower()
    for spec in _SPECS:
        if suffix and suffix in spec.extensions:
            return spec
    return LANGUAGES["text"]


@cache
def parser_for(name: str):
    """A tree-sitter parser for a language with a grammar (grammar wheels are imported on first use)."""
    import tree_sitter

    spec = LANGUAGES[name]
    if spec.grammar is None:
        raise VkvError(f"language '{name}' has no tree-sitter grammar in vkv")
    module_name, function_name = spec.grammar
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        package = module_name.replace("_", "-")
        raise VkvError(f"the {name} grammar is not installed; pip install {package}") from exc
    return tree_sitter.Parser(tree_sitter.Language(getattr(module, function_name)()))
