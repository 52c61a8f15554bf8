"""The whole backend: hard budget cap, edge cases, syntax of the output, rank-only, messages, CLI.

Unit tests run a tiny random Llama with the real SmolLM2 tokenizer (scores are noise, structure is
not); the tests marked `integration` run the real test model and check that relevance works.
"""

from __future__ import annotations

import ast
import json
import textwrap

import pytest
import torch

from vkv.backends.longcodezip import LongCodeZip, LongCodeZipSettings, read_source
from vkv.backends.longcodezip.cli import prune_file
from vkv.backends.longcodezip.tokens import count_tokens
from vkv.backends.source.treesitter import parser_for
from vkv.errors import VkvError
from vkv.lm import zoo
from vkv.lm.frozen import FrozenLM

JAVASCRIPT = """\
'use strict';

const fs = require('fs');
const path = require('path');

/**
 * Reads a JSON file and returns the parsed object.
 */
function readJson(file) {
  const text = fs.readFileSync(file, 'utf8');
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Error(`invalid JSON in ${file}: ${err.message}`);
  }
}

class TaskQueue {
  constructor(limit) {
    this.limit = limit;
    this.running = 0;
    this.pending = [];
  }

  push(task) {
    this.pending.push(task);
    this.next();
  }

  next() {
    while (this.running < this.limit && this.pending.length > 0) {
      const task = this.pending.shift();
      this.running += 1;
      task().finally(() => {
        this.running -= 1;
        this.next();
      });
    }
  }
}

function slugify(title) {
  return title
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-|-$/g, '');
}

async function copyTree(src, dest) {
  await fs.promises.mkdir(dest, { recursive: true });
  for (const entry of await fs.promises.readdir(src, { withFileTypes: true })) {
    const from = path.join(src, entry.name);
    const to = path.join(dest, entry.name);
    if (entry.isDirectory()) {
      await copyTree(from, to);
    } else {
      await fs.promises.copyFile(from, to);
    }
  }
}

module.exports = { readJson, TaskQueue, slugify, copyTree };
"""

GO = """\
package cache

import (
\t"container/list"
\t"sync"
)

// entry is one cached key and its value.
type entry struct {
\tkey   string
\tvalue []byte
}

// LRU is a fixed-size cache that evicts the least recently used entry.
type LRU struct {
\tmu       sync.Mutex
\tcapacity int
\torder    *list.List
\titems    map[string]*list.Element
}

// New returns an empty cache holding at most capacity entries.
func New(capacity int) *LRU {
\treturn &LRU{capacity: capacity, order: list.New(), items: make(map[string]*list.Element)}
}

// Get returns the value for key and marks it as recently used.
func (c *LRU) Get(key string) ([]byte, bool) {
\tc.mu.Lock()
\tdefer c.mu.Unlock()
\tif el, ok := c.items[key]; ok {
\t\tc.order.MoveToFront(el)
\t\treturn el.Value.(*entry).value, true
\t}
\treturn nil, false
}

// Put stores value under key, evicting the oldest entry when full.
func (c *LRU) Put(key string, value []byte) {
\tc.mu.Lock()
\tdefer c.mu.Unlock()
\tif el, ok := c.items[key]; ok {
\t\tel.Value.(*entry).value = value
\t\tc.order.MoveToFront(el)
\t\treturn
\t}
\tc.items[key] = c.order.PushFront(&entry{key, value})
\tif c.order.Len() > c.capacity {
\t\toldest := c.order.Back()
\t\tc.order.Remove(oldest)
\t\tdelete(c.items, oldest.Value.(*entry).key)
\t}
}

// Len reports how many entries are cached.
func (c *LRU) Len() int {
\tc.mu.Lock()
\tdefer c.mu.Unlock()
\treturn c.order.Len()
}
"""

PYTHON = textwrap.dedent(
    '''\
    """Small helpers."""
    import re

    WORD = re.compile(r"\\w+")


    def words(text):
        """Split text into words."""
        return WORD.findall(text)


    class Counter:
        def __init__(self):
            self.counts = {}

        def add(self, text):
            for word in words(text):
                if word in self.counts:
                    self.counts[word] += 1
                else:
                    self.counts[word] = 1
            return self

        def top(self, n=3):
            ranked = sorted(self.counts.items(), key=lambda kv: -kv[1])
            return ranked[:n]


    def main():
        counter = Counter()
        counter.add("a b a c b a")
        print(counter.top())
    '''
)


def tree_sitter_clean(text: str, language: str) -> bool:
    return not parser_for(language).parse(text.encode("utf-8")).root_node.has_error


def python_parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


@pytest.fixture(scope="module")
def tiny_lm(tiny_llama) -> FrozenLM:
    """conftest's tiny random Llama with the real SmolLM2 tokenizer: fast, and scores are noise."""
    return tiny_llama


@pytest.fixture(scope="module")
def pruner(tiny_lm) -> LongCodeZip:
    return LongCodeZip(tiny_lm)


# ---- the budget is a hard cap on the rendered output ---------------------------------------------------
@pytest.mark.parametrize(
    "source, language, check",
    [(PYTHON, "python", python_parses), (JAVASCRIPT, "javascript", None), (GO, "go", None)],
    ids=["python", "javascript", "go"],
)
def test_budget_caps_the_rendered_output_and_syntax_survives(pruner, source, language, check):
    tokenizer = pruner.lm.tokenizer
    original = count_tokens(tokenizer, source)
    for budget in (1, 12, original // 6, original // 2):
        result = pruner.prune(source, "where are entries evicted?", budget=budget, language=language)
        assert result.compressed_tokens == count_tokens(tokenizer, result.text)
        assert result.compressed_tokens <= budget, (budget, result.text)
        assert result.original_tokens == original
        ok = check(result.text) if check else tree_sitter_clean(result.text, language)
        assert ok, result.text
        kept = [source.splitlines(keepends=True)[i] for i in result.kept_lines]
        assert all(line in result.text for line in kept)  # kept lines appear verbatim
    result = pruner.prune(source, "how is a task queued?", ratio=1.5, language=language)
    assert result.compressed_tokens <= int(original / 1.5)


def test_budget_is_used_not_wasted(pruner):
    result = pruner.prune(JAVASCRIPT, "copy a directory tree", ratio=2.0, language="javascript")
    assert result.compressed_tokens >= 0.8 * result.report["budget"]


def test_report_names_chunks_scores_and_blocks(pruner):
    result = pruner.prune(GO, "how does Put evict the oldest entry?", ratio=3.0, language="go")
    report = result.report
    assert report["status"] == "pruned" and report["language"] == "go"
    names = [c["name"] for c in report["chunks"]]
    assert {"New", "Get", "Put", "Len", "LRU"} <= set(names)
    assert all(isinstance(c["ami_bits"], float) for c in report["chunks"])
    assert any(c["kept"] for c in report["chunks"]) and not all(c["kept"] for c in report["chunks"])
    fine = [c for c in report["chunks"] if "blocks" in c]
    assert fine and all(b["lines"][0] < b["lines"][1] for c in fine for b in c["blocks"])
    assert report["model_tokens"]["lines"]["tokens"] == 0  # line scores came out of the ranking pass
    assert report["model_tokens"]["coarse"]["tokens"] > 0


def test_rank_only_keeps_whole_chunks(tiny_lm):
    pruner = LongCodeZip(tiny_lm, settings=LongCodeZipSettings(rank_only=True))
    result = pruner.prune(PYTHON, "count words", ratio=2.0, language="python")
    assert result.compressed_tokens <= result.report["budget"] and python_parses(result.text)
    for chunk in result.report["chunks"]:
        assert "blocks" not in chunk
        start, end = chunk["lines"]
        if chunk["kept"]:
            lines = PYTHON.splitlines()[start:end]
            assert all(line in result.text for line in lines if line.strip())


def test_a_separate_line_model_scores_lines_itself(tiny_lm):
    other = FrozenLM(tiny_lm.model, tiny_lm.tokenizer, name="tiny-lines", quant="fp32", device=torch.device("cpu"))
    result = LongCodeZip(tiny_lm, line_lm=other).prune(GO, "evict", ratio=3.0, language="go")
    assert result.report["line_model"] == "tiny-lines"
    assert result.report["model_tokens"]["lines"]["tokens"] > 0
    assert tree_sitter_clean(result.text, "go")


# ---- edge cases ------------------------------------------------------------------------------------
def test_empty_input_is_returned_unchanged(pruner):
    for text in ("", "\n\n  \n"):
        result = pruner.prune(text, "anything", ratio=4.0, language="python")
        assert result.text == text and result.report["reason"] == "empty input"


def test_input_under_budget_is_returned_unchanged(pruner):
    result = pruner.prune(PYTHON, "count words", budget=10_000, language="python")
    assert result.text == PYTHON
    assert result.compressed_tokens == result.original_tokens
    assert result.report["status"] == "unchanged" and result.report["reason"] == "already within budget"
    assert result.kept_lines == list(range(len(PYTHON.splitlines())))


def test_one_huge_function(pruner):
    body = "".join(f"    value_{i} = transform(value_{i - 1}, {i})\n" for i in range(1, 120))
    source = f"def pipeline(value_0):\n{body}    return value_119\n"
    result = pruner.prune(source, "what does the pipeline return?", ratio=5.0, language="python")
    assert result.compressed_tokens <= result.report["budget"]
    assert result.text.startswith("def pipeline(value_0):\n")
    assert python_parses(result.text)
    assert len(result.kept_lines) > 10  # the fine stage kept parts of it, not just the signature


def test_bad_arguments_are_clear_errors(pruner):
    with pytest.raises(VkvError, match="at least 1"):
        pruner.prune(PYTHON, "q", ratio=0.5, language="python")
    with pytest.raises(VkvError, match="exactly one"):
        pruner.prune(PYTHON, "q", ratio=2.0, budget=10, language="python")
    with pytest.raises(VkvError, match="query is empty"):
        pruner.prune(PYTHON, "  ", ratio=2.0, language="python")
    with pytest.raises(VkvError, match="unknown language"):
        pruner.prune(PYTHON, "q", ratio=2.0, language="klingon")


def test_undecodable_bytes_name_the_file(tmp_path):
    bad = tmp_path / "latin1.py"
    bad.write_bytes(b"x = 'caf\xe9'\n")
    with pytest.raises(VkvError, match=r"latin1\.py: not valid UTF-8 \(undecodable byte at offset 8\)"):
        read_source(bad)
    with pytest.raises(VkvError, match="no such file"):
        read_source(tmp_path / "missing.py")
    good = tmp_path / "crlf.py"
    good.write_bytes(b"a = 1\r\nb = 2\r\n")
    assert read_source(good) == "a = 1\r\nb = 2\r\n"


# ---- transcripts ----------------------------------------------------------------------------------
def test_messages_are_pruned_per_message_within_the_budget(pruner):
    messages = [
        "user: the cache evicts the wrong entry, can you look?",
        f"assistant: here is the file\n```go\n{GO}```\n",
        "tool: ran `go test ./...`\nok   cache   0.012s\n",
        "user: now also make Len safe",
    ]
    result = pruner.prune_messages(messages, "make Len safe", ratio=3.0)
    assert result.compressed_tokens <= result.report["budget"]
    texts = result.report["messages"]
    assert len(texts) == len(messages)
    fenced = texts[1]
    if "```go" in fenced:  # the fence survives as a pair, its code still parses as Go
        inner = fenced.split("```go\n", 1)[1].rsplit("```", 1)[0]
        assert fenced.count("```") == 2 and tree_sitter_clean(inner, "go")


# ---- CLI entry ----------------------------------------------------------------------------------------
def test_run_prune_writes_json(tiny_lm, tmp_path):
    source = tmp_path / "lru.go"
    source.write_text(GO, encoding="utf-8")
    out = tmp_path / "out.json"
    payload = prune_file(source, query="evict", ratio=3.0, json_path=out, lm=tiny_lm)
    assert payload["language"] == "go" and payload["compressed_tokens"] <= payload["original_tokens"] // 3
    assert json.loads(out.read_text())["text"] == payload["text"]
    with pytest.raises(VkvError, match="--query is required"):
        prune_file(source, query=None, ratio=2.0, lm=tiny_lm)


# ---- the real test model ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_pruner(request) -> LongCodeZip:
    if not zoo.is_fetched("smollm2-135m"):
        pytest.skip("the test model smollm2-135m is not fetched (run `vkv models fetch smollm2-135m`)")
    return LongCodeZip(request.getfixturevalue("smol"))  # loaded once per session by conftest


@pytest.mark.integration
def test_stdlib_python_keeps_the_function_asked_about(real_pruner):
    source = read_source(textwrap.__file__)
    query = "How does dedent remove the common leading whitespace from every line of a text?"
    result = real_pruner.prune(source, query, ratio=4.0, language="python")
    assert result.compressed_tokens <= result.report["budget"]
    ast.parse(result.text)
    assert "def dedent(text):" in result.text
    dedent = next(c for c in result.report["chunks"] if c["name"] == "dedent")
    assert dedent["kept"] and dedent["ami_bits"] == max(c["ami_bits"] for c in result.report["chunks"])


@pytest.mark.integration
@pytest.mark.parametrize(
    "source, language, query, signature",
    [
        (JAVASCRIPT, "javascript", "How does slugify turn a title into a slug?", "function slugify(title) {"),
        (GO, "go", "How does Put evict the oldest entry when the LRU cache is full?", "func (c *LRU) Put("),
    ],
    ids=["javascript", "go"],
)
def test_js_and_go_keep_the_function_asked_about_and_parse(real_pruner, source, language, query, signature):
    result = real_pruner.prune(source, query, ratio=3.0, language=language)
    assert result.compressed_tokens <= result.report["budget"]
    assert tree_sitter_clean(result.text, language), result.text
    assert signature in result.text
