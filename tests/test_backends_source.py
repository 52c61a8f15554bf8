"""The source layer both text backends share: language table, tree-sitter loader, lines, placeholders."""

import pytest

from vkv.backends.source.languages import LANGUAGES, canonical_name, find_language, language_of_path, lookup_language
from vkv.backends.source.lines import LineIndex, indentation, split_lines
from vkv.backends.source.placeholders import placeholder_line
from vkv.backends.source.treesitter import grammar_installed, parser_for, require_parser
from vkv.errors import VkvError

TEXTS = ["", "a", "a\n", "a\nb", "a\r\nb\r\n", "a\rb\r", "a\r\r\nb", "\n\n", "x\fy\n", "x\u2028y\n", "tail\r"]


@pytest.mark.parametrize("name", sorted(n for n, language in LANGUAGES.items() if language.grammar))
def test_every_language_with_a_grammar_loads_a_parser_that_parses(name):
    tree = parser_for(name).parse(b"x\n")
    assert tree.root_node is not None
    assert require_parser(name) is parser_for(name)  # loaded once
    assert grammar_installed(name)


def test_languages_without_a_grammar_have_no_parser():
    assert parser_for("markdown") is None and not grammar_installed("markdown") and not grammar_installed(None)
    with pytest.raises(VkvError, match="no tree-sitter grammar"):
        require_parser("markdown")


def test_names_aliases_and_extensions_resolve_in_one_table():
    assert canonical_name(" JS ") == "javascript" and canonical_name("c++") == "cpp" and canonical_name("cobol") is None
    assert find_language("yml").comment == ("#", "") and find_language(None) is None
    assert language_of_path("a/B.HPP").name == "cpp" and language_of_path("README").name == "text"
    assert language_of_path("x.unknown") is None
    owners = [ext for language in LANGUAGES.values() for ext in language.extensions]
    assert len(owners) == len(set(owners))  # an extension belongs to one language
    with pytest.raises(VkvError, match="unknown language 'cobol'; known languages: "):
        lookup_language("cobol")


@pytest.mark.parametrize("text", TEXTS)
def test_split_lines_round_trips_in_both_modes(text):
    assert "".join(split_lines(text)) == text
    assert "".join(split_lines(text, line_feed_only=True)) == text


def test_split_lines_ends_lines_as_python_or_as_tree_sitter_does():
    assert split_lines("a\rb\r\nc\nd") == ["a\r", "b\r\n", "c\n", "d"]
    assert split_lines("a\rb\r\nc\nd", line_feed_only=True) == ["a\rb\r\n", "c\n", "d"]
    assert split_lines("x\fy\n") == ["x\fy\n"]  # unlike str.splitlines


def test_line_index_and_indentation():
    index = LineIndex.of("ab\r\n\tc\n")
    assert index.starts == [0, 4] and len(index) == 2 and index.content_span(0) == (0, 2)
    assert indentation("\t  x = 1\n") == "\t  " and indentation("\f x", " \t") == ""


def test_placeholder_line_for_known_inputs():
    assert placeholder_line(3, ("#", "")) == "# … 3 lines omitted\n"
    assert placeholder_line(1, ("<!--", "-->"), "  ", "\r\n") == "  <!-- … 1 line omitted -->\r\n"
    assert placeholder_line(2, ("#", ""), "    ", statement=True, ellipsis="...") == "    ...  # ... 2 lines omitted\n"
    assert placeholder_line(5, ("", ""), ending="", ellipsis="...") == "... 5 lines omitted"
