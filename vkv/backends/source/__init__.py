"""Source text as both text-level backends (longcodezip, lamr) read it.

languages.py (one table: names, extensions, comment syntax, tree-sitter grammar) · treesitter.py (the
cached parser loader) · lines.py (splitting text into lines) · placeholders.py (the comment that stands
for elided lines).
"""
