"""The one table of languages the backends know: name, file extensions, comment syntax, tree-sitter grammar.

A language with a grammar can be parsed (treesitter.py); every language can write a placeholder comment
(placeholders.py). Names are looked up case-insensitively, through the aliases people write after a
markdown fence or on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vkv.errors import VkvError


@dataclass(frozen=True)
class Language:
    """One row of the table."""

    name: str
    extensions: tuple[str, ...]  # "" owns files without an extension
    comment: tuple[str, str]  # (opening, closing) of a one-line comment; closing may be ""
    grammar: tuple[str, str] | None = None  # (python module, function returning the tree-sitter language)


def _named(comment: tuple[str, str], *names: str) -> list[Language]:
    """Languages known by name only (a lamr record or --language may name them). They own no extension
    because giving them one would change how longcodezip detects those files (as plain text today)."""
    return [Language(name, (), comment) for name in names]


_TABLE = [
    Language("python", (".py", ".pyi", ".pyw"), ("#", ""), ("tree_sitter_python", "language")),
    Language("javascript", (".js", ".jsx", ".mjs", ".cjs"), ("//", ""), ("tree_sitter_javascript", "language")),
    Language("typescript", (".ts", ".mts", ".cts"), ("//", ""), ("tree_sitter_typescript", "language_typescript")),
    Language("tsx", (".tsx",), ("//", ""), ("tree_sitter_typescript", "language_tsx")),
    Language("java", (".java",), ("//", ""), ("tree_sitter_java", "language")),
    Language("go", (".go",), ("//", ""), ("tree_sitter_go", "language")),
    Language("rust", (".rs",), ("//", ""), ("tree_sitter_rust", "language")),
    Language("c", (".c", ".h"), ("//", ""), ("tree_sitter_c", "language")),
    Language(
        "cpp",
        (".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx", ".h++", ".ipp"),
        ("//", ""),
        ("tree_sitter_cpp", "language"),
    ),
    Language("text", (".txt", ".log", ""), ("<!--", "-->")),
    Language("markdown", (".md", ".markdown", ".rst"), ("<!--", "-->")),
    Language("html", (".html", ".htm", ".xml", ".svg", ".vue"), ("<!--", "-->")),
    Language("shell", (".sh", ".bash", ".zsh"), ("#", "")),
    Language("yaml", (".yaml", ".yml", ".toml", ".ini", ".cfg"), ("#", "")),
    Language("ruby", (".rb",), ("#", "")),
    Language("sql", (".sql",), ("--", "")),
    Language("css", (".css", ".scss", ".less"), ("/*", "*/")),
    Language("kotlin", (".kt", ".kts"), ("//", "")),
    Language("scala", (".scala",), ("//", "")),
    Language("swift", (".swift",), ("//", "")),
    Language("csharp", (".cs",), ("//", "")),
    Language("php", (".php",), ("//", "")),
    *_named(("#", ""), "r", "perl", "makefile", "dockerfile"),
    *_named(("--", ""), "lua", "haskell"),
    *_named(("//", ""), "dart"),
]
LANGUAGES: dict[str, Language] = {language.name: language for language in _TABLE}

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
    "c#": "csharp",
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
    "svg": "html",
}


def find_language(name: str | None) -> Language | None:
    """The language called `name` or one of its aliases; None when unknown or not given."""
    key = (name or "").strip().lower()
    return LANGUAGES.get(_ALIASES.get(key, key))


def canonical_name(name: str | None) -> str | None:
    """The table's name for `name` or an alias of it (`js` → `javascript`); None when unknown."""
    language = find_language(name)
    return language.name if language is not None else None


def lookup_language(name: str) -> Language:
    """Like find_language, but an unknown name is a VkvError listing the known ones."""
    language = find_language(name)
    if language is None:
        raise VkvError(f"unknown language '{name}'; known languages: {', '.join(sorted(LANGUAGES))}")
    return language


def language_of_path(path: str | Path) -> Language | None:
    """The language owning the file's extension (compared in lower case), or None."""
    suffix = Path(path).suffix.lower()
    return next((language for language in _TABLE if suffix in language.extensions), None)
