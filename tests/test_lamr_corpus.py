"""The synthetic corpus: real stdlib snippets, evidence-only kept lines, file-disjoint splits."""

import ast
from pathlib import Path

from vkv.backends.lamr.corpus import CorpusConfig, build_corpus, default_sources, is_validation_file, python_files
from vkv.backends.lamr.labels import rubric_labels


def test_corpus_records_are_parseable_and_evidence_only():
    files = python_files(default_sources())
    assert files and not any("site-packages" in f.parts for f in files)
    records = build_corpus(files[:80], 40, CorpusConfig(seed=3))
    assert len(records) == 40
    assert len({(r.code, r.query) for r in records}) == 40
    by_code = {}
    for r in records:
        by_code.setdefault(r.code, set()).add(r.kept_frags)
    assert any(len(kept) > 1 for kept in by_code.values())  # same code, different queries, different evidence
    assert any(r.score == 0.0 and not r.kept_frags for r in records)
    for record in records:
        ast.parse(record.code)
        lines = record.code.splitlines()
        assert all(1 <= k <= len(lines) for k in record.kept_frags)
        if record.score > 0:
            assert record.kept_frags
            kept_text = [lines[k - 1].strip() for k in record.kept_frags]
            # the builder never marks imports: dependency support is left to labels.py
            assert not any(t.startswith(("import ", "from ")) for t in kept_text)
    positive = next(r for r in records if r.score > 0)
    labels = rubric_labels(positive.code, positive.kept_lines, positive.score)
    assert labels.analysis == "python-ast"


def test_split_is_by_file_and_deterministic():
    files = python_files(default_sources())[:200]
    val = [f for f in files if is_validation_file(f, 0.2)]
    assert 0 < len(val) < len(files)
    assert val == [f for f in files if is_validation_file(f, 0.2)]
    first = build_corpus(files[:30], 10, CorpusConfig(seed=1))
    again = build_corpus(files[:30], 10, CorpusConfig(seed=1))
    assert first == again
    excluded = build_corpus(files[:30], 10, CorpusConfig(seed=1), exclude_codes={r.code for r in first})
    assert not {r.code for r in excluded} & {r.code for r in first}


def test_split_does_not_depend_on_where_the_tree_lives(tmp_path):
    names = [Path(f"pkg/mod_{i}.py") for i in range(40)]
    for root in (tmp_path / "a", tmp_path / "elsewhere" / "b"):
        root.mkdir(parents=True)
    here = [is_validation_file(tmp_path / "a" / n, 0.3, tmp_path / "a") for n in names]
    there = [is_validation_file(tmp_path / "elsewhere" / "b" / n, 0.3, tmp_path / "elsewhere" / "b") for n in names]
    assert here == there and 0 < sum(here) < len(names)
