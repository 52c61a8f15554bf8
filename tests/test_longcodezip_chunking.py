"""Tree-sitter units and chunks, syntax-preserving closure, and placeholder rendering (no model needed)."""

from __future__ import annotations

import ast
import random

import numpy as np
import pytest

from vkv.backends.longcodezip.chunking import ChunkLimits, chunk_document
from vkv.backends.longcodezip.closure import close_kept_lines
from vkv.backends.longcodezip.document import parse_document, parse_messages
from vkv.backends.longcodezip.languages import NODE_ROLES, detect_language
from vkv.backends.longcodezip.render import render
from vkv.backends.longcodezip.units import FREE
from vkv.backends.source.languages import LANGUAGES, lookup_language
from vkv.backends.source.treesitter import parser_for
from vkv.errors import VkvError

PYTHON = '''\
"""Module docstring."""
import os

LIMIT = 3


# Fetches one page.
@retry(times=3)
@trace
async def fetch(url):
    async with session.get(url) as response:
        return await response.text()


class Store:
    """A key-value store."""

    kind = "memory"

    def __init__(self):
        self.items = {}

    @property
    def size(self):
        return len(self.items)

    async def load(self, path):
        for line in open(path):
            key, value = line.split("=", 1)
            self.items[key] = value
        return self.items


if __name__ == "__main__":
    print(fetch("x"))
'''

JAVASCRIPT = """\
import { readFile } from "fs/promises";

/**
 * Parses a config file.
 */
export async function parseConfig(path) {
  const text = await readFile(path, "utf8");
  if (!text) {
    throw new Error("empty");
  } else {
    console.log("ok");
  }
  return JSON.parse(text);
}

class Cache {
  constructor() {
    this.map = new Map();
  }

  get(key) {
    return this.map.get(key);
  }

  set(key, value) {
    switch (typeof value) {
      case "string":
        this.map.set(key, value.trim());
        break;
      default:
        this.map.set(key, value);
    }
  }
}

const double = (x) => {
  return x * 2;
};

module.exports = { parseConfig, Cache, double };
"""

GO = """\
package store

import (
\t"errors"
\t"fmt"
)

// ErrMissing is returned for unknown keys.
var ErrMissing = errors.New("missing")

// Store keeps values in memory.
type Store struct {
\titems map[string]string
\tcount int
}

// Get returns the value for key.
func (s *Store) Get(key string) (string, error) {
\tvalue, ok := s.items[key]
\tif !ok {
\t\treturn "", ErrMissing
\t}
\treturn value, nil
}

func describe(v interface{}) string {
\tswitch x := v.(type) {
\tcase int:
\t\treturn fmt.Sprintf("int %d", x)
\tcase string:
\t\treturn "string " + x
\tdefault:
\t\treturn "other"
\t}
}
"""

TYPESCRIPT = """\
interface Shape {
  area(): number;
  name: string;
}

export class Circle implements Shape {
  name = "circle";
  constructor(private r: number) {}

  area(): number {
    const square = this.r * this.r;
    return Math.PI * square;
  }
}

export function total(shapes: Shape[]): number {
  let sum = 0;
  for (const s of shapes) {
    sum += s.area();
  }
  return sum;
}
"""

JAVA = """\
package demo;

import java.util.List;

/** A counter. */
public class Counter {
    private int count = 0;

    @Override
    public String toString() {
        return "Counter(" + count + ")";
    }

    public int add(List<Integer> values) {
        for (int v : values) {
            if (v > 0) {
                count += v;
            }
        }
        return count;
    }
}
"""

RUST = """\
use std::collections::HashMap;

/// A store.
#[derive(Debug, Default)]
pub struct Store {
    items: HashMap<String, String>,
}

impl Store {
    pub fn get(&self, key: &str) -> Option<&String> {
        self.items.get(key)
    }

    pub fn put(&mut self, key: &str, value: &str) -> usize {
        let n = match self.items.insert(key.into(), value.into()) {
            Some(_) => 0,
            None => 1,
        };
        n
    }
}
"""

C = """\
#include <stdio.h>

struct point {
    int x;
    int y;
};

static int sum(const int *values, int n) {
    int total = 0;
    for (int i = 0; i < n; i++) {
        total += values[i];
    }
    return total;
}

int main(void) {
    int v[3] = {1, 2, 3};
    printf("%d\\n", sum(v, 3));
    return 0;
}
"""

CPP = """\
#include <vector>

namespace geo {
template <typename T>
class Box {
 public:
  explicit Box(T v) : value_(v) {}
  T get() const {
    return value_;
  }

 private:
  T value_;
};

int area(int w, int h) {
  if (w < 0 || h < 0) {
    return 0;
  }
  return w * h;
}
}  // namespace geo
"""

SAMPLES = {
    "python": PYTHON,
    "javascript": JAVASCRIPT,
    "go": GO,
    "typescript": TYPESCRIPT,
    "java": JAVA,
    "rust": RUST,
    "c": C,
    "cpp": CPP,
}


def char_tokens(doc) -> np.ndarray:
    """A stand-in tokenizer for chunking tests: one token per character."""
    return np.array([len(line) for line in doc.lines], dtype=np.int64)


def chunks_of(source: str, language: str, class_tokens: int = 10_000, piece_tokens: int = 10_000):
    doc = parse_document(source, lookup_language(language))
    return doc, chunk_document(doc, char_tokens(doc), ChunkLimits(class_tokens, piece_tokens))


def parses(text: str, language: str) -> bool:
    if language == "python":
        try:
            ast.parse(text)
        except SyntaxError:
            return False
        return True
    return not parser_for(language).parse(text.encode("utf-8")).root_node.has_error


def line_of(source: str, needle: str) -> int:
    return next(i for i, line in enumerate(source.splitlines()) if needle in line)


# ---- languages -------------------------------------------------------------------------------------
def test_language_detection_by_extension_with_override():
    assert detect_language("a/b/c.py").name == "python"
    assert detect_language("x.tsx").name == "tsx"
    assert detect_language("x.hpp").name == "cpp"
    assert detect_language("notes.md").name == "markdown"
    assert detect_language("README").name == "text"
    assert detect_language("x.txt", override="go").name == "go"
    assert lookup_language("JS").name == "javascript"
    with pytest.raises(VkvError, match="unknown language 'cobol'"):
        lookup_language("cobol")


def test_every_language_with_a_grammar_has_node_roles():
    assert {name for name, language in LANGUAGES.items() if language.grammar} == set(NODE_ROLES)


@pytest.mark.parametrize("language", sorted(SAMPLES))
def test_every_sample_parses_cleanly(language):
    doc = parse_document(SAMPLES[language], lookup_language(language))
    assert not doc.parse_errors


# ---- chunks ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("language", sorted(SAMPLES))
def test_chunks_partition_the_lines(language):
    doc, chunks = chunks_of(SAMPLES[language], language, class_tokens=120, piece_tokens=200)
    assert chunks[0].start == 0 and chunks[-1].end == len(doc.lines)
    assert all(a.end == b.start for a, b in zip(chunks, chunks[1:]))


def test_python_decorators_async_and_leading_comment_belong_to_their_function():
    doc, chunks = chunks_of(PYTHON, "python")
    fetch = next(c for c in chunks if c.name == "fetch")
    assert fetch.kind == "function"
    assert fetch.start == line_of(PYTHON, "# Fetches one page.")
    assert "@retry" in doc.lines[fetch.start + 1] and "async def fetch" in doc.lines[fetch.start + 3]
    store = next(c for c in chunks if c.name == "Store")
    assert store.kind == "class" and store.end == line_of(PYTHON, 'if __name__ == "__main__":')
    assert [c.kind for c in chunks] == ["code", "function", "class", "code"]


def test_python_oversized_class_is_split_into_methods_header_with_the_first_chunk():
    doc, chunks = chunks_of(PYTHON, "python", class_tokens=100)
    names = [c.name for c in chunks]
    assert names[:3] == ["module code", "fetch", "Store"]
    store = chunks[2]
    assert doc.lines[store.start].startswith("class Store")
    assert store.kind == "class" and store.head is not None
    assert "size" in names and "load" in names and "__init__" in names
    size = next(c for c in chunks if c.name == "size")
    assert doc.lines[size.start].strip() == "@property"  # the decorator stays with its method
    load = next(c for c in chunks if c.name == "load")
    assert "async def load" in doc.lines[load.start]


def test_javascript_chunks():
    doc, chunks = chunks_of(JAVASCRIPT, "javascript", class_tokens=150)
    by_name = {c.name: c for c in chunks}
    parse = by_name["parseConfig"]
    assert parse.kind == "function" and doc.lines[parse.start].startswith("/**")  # JSDoc attached
    assert by_name["Cache"].kind == "class" and doc.lines[by_name["Cache"].start].startswith("class Cache")
    assert {"get", "set"} <= set(by_name)  # the class was split into its methods
    assert by_name["double"].kind == "function"  # `const double = (x) => {…}`


def test_go_chunks_with_doc_comments():
    doc, chunks = chunks_of(GO, "go")
    by_name = {c.name: c for c in chunks}
    assert by_name["Get"].kind == "function"
    assert doc.lines[by_name["Get"].start].startswith("// Get returns")
    assert by_name["describe"].kind == "function"
    assert by_name["Store"].kind == "class" and doc.lines[by_name["Store"].start].startswith("// Store keeps")
    assert chunks[0].kind == "code" and chunks[0].start == 0  # package, imports, var


def test_one_huge_function_is_split_into_pieces_that_keep_the_signature_first():
    body = "".join(f"    x{i} = compute({i})\n" for i in range(200))
    source = f"def huge(a, b):\n{body}    return x0\n"
    doc, chunks = chunks_of(source, "python", piece_tokens=800)
    assert len(chunks) > 3
    assert chunks[0].kind == "function" and chunks[0].name == "huge" and chunks[0].head is not None
    assert all(c.kind == "piece" for c in chunks[1:])
    sizes = [sum(len(line) for line in doc.lines[c.start : c.end]) for c in chunks]
    assert max(sizes) <= 800


def test_prose_paragraphs_and_fences():
    text = "First paragraph\nstill first.\n\nSecond.\n\n```python\ndef f():\n    return 1\n```\n\nEnd.\n"
    doc, chunks = chunks_of(text, "markdown")
    assert [c.kind for c in chunks] == ["paragraph", "paragraph", "fence", "paragraph"]
    fence = chunks[2]
    assert doc.line_language[fence.start + 1] == "python"  # the fenced code keeps its own language
    assert doc.line_language[fence.start] == "markdown"


def test_messages_are_one_chunk_each():
    messages = ["user: please fix the bug", "assistant: here\n```go\nfunc f() {}\n```\n", "user: thanks"]
    doc = parse_messages(messages, lookup_language("markdown"))
    chunks = chunk_document(doc, char_tokens(doc), ChunkLimits(10_000, 10_000))
    assert [c.kind for c in chunks] == ["message"] * 3
    assert doc.messages == [(0, 1), (1, 5), (5, 6)]


# ---- closure and rendering -------------------------------------------------------------------------
@pytest.mark.parametrize("language", sorted(SAMPLES))
def test_any_kept_set_renders_to_valid_syntax(language):
    """Random subsets of lines, closed and rendered, must always parse (the closure's promise)."""
    doc = parse_document(SAMPLES[language], lookup_language(language))
    rng = random.Random(language)
    for trial in range(150):
        p = [0.05, 0.2, 0.5, 0.8][trial % 4]
        kept = np.array([rng.random() < p for _ in doc.lines])
        closed, statements = close_kept_lines(doc, kept)
        asked = kept & (np.asarray(doc.owner) != FREE)
        assert closed[asked].all()  # a superset of the non-blank lines asked for
        out = render(doc, closed, statements)
        assert parses(out, language), out


def test_keeping_a_statement_keeps_its_enclosing_headers_and_braces():
    doc = parse_document(JAVASCRIPT, lookup_language("javascript"))
    kept = np.zeros(len(doc.lines), dtype=bool)
    kept[line_of(JAVASCRIPT, 'throw new Error("empty")')] = True
    closed, _ = close_kept_lines(doc, kept)
    out = render(doc, closed, set())
    assert "export async function parseConfig(path) {" in out
    assert "  if (!text) {" in out and "  } else {" in out
    assert out.count("{") == out.count("}")
    assert parses(out, "javascript")


def test_python_placeholder_becomes_a_statement_where_a_body_would_be_empty():
    doc = parse_document(PYTHON, lookup_language("python"))
    kept = np.zeros(len(doc.lines), dtype=bool)
    kept[line_of(PYTHON, "for line in open(path):")] = True
    closed, statements = close_kept_lines(doc, kept)
    out = render(doc, closed, statements)
    assert "class Store:" in out and "    async def load(self, path):" in out
    assert "\n            ...  # … " in out  # the emptied loop body gets a statement at its own indentation
    ast.parse(out)


def test_placeholders_use_the_language_comment_syntax_and_count_lines():
    for language, opening in (("python", "# … "), ("go", "// … "), ("markdown", "<!-- … ")):
        doc = parse_document("a\nb\nc\nd\n" if language == "markdown" else SAMPLES[language], lookup_language(language))
        kept = np.zeros(len(doc.lines), dtype=bool)
        out = render(doc, kept, set())
        assert out == f"{opening}{len(doc.lines)} lines omitted{' -->' if language == 'markdown' else ''}\n"


def test_whitespace_and_line_endings_are_preserved():
    source = "def f():\r\n\tx = 1\r\n\r\n\ty = 2\r\n\treturn x\r\n"
    doc = parse_document(source, lookup_language("python"))
    assert doc.owner[2] == FREE
    kept = np.array([True, True, True, False, True])
    closed, statements = close_kept_lines(doc, kept)
    out = render(doc, closed, statements)
    # The blank line next to the removed one goes with it; kept lines keep their tabs and CRLF.
    assert out == "def f():\r\n\tx = 1\r\n\t# … 2 lines omitted\r\n\treturn x\r\n"
