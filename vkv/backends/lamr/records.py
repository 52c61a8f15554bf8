"""SWE-Pruner's training record: one JSON object per line with `query`, `code`, `kept_frags`, `score`.

`kept_frags` lists the teacher's kept lines, 1-based; `score` is the teacher's document relevance in
[0, 1]. vkv adds an optional `language` (default python) and ignores any other fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vkv.backends.source.lines import split_lines
from vkv.errors import VkvError
from vkv.io import atomic_path


@dataclass(frozen=True)
class Record:
    query: str
    code: str
    kept_frags: tuple[int, ...]
    score: float
    language: str = "python"

    @property
    def kept_lines(self) -> list[int]:
        """0-based kept lines."""
        return [k - 1 for k in self.kept_frags]

    def to_json(self) -> dict:
        data = {"query": self.query, "code": self.code, "kept_frags": list(self.kept_frags), "score": self.score}
        if self.language != "python":
            data["language"] = self.language
        return data


def read_records(path: str | Path) -> list[Record]:
    source = Path(path)
    if not source.is_file():
        raise VkvError(f"training data {source} does not exist")
    records = []
    with open(source, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                records.append(parse_record(line, f"{source}:{number}"))
    if not records:
        raise VkvError(f"training data {source} holds no records")
    return records


def parse_record(line: str, where: str) -> Record:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise VkvError(f"{where}: not valid JSON ({exc.msg})") from exc
    if not isinstance(data, dict):
        raise VkvError(f"{where}: a record must be a JSON object")
    query, code = data.get("query"), data.get("code")
    if not isinstance(query, str) or not query.strip():
        raise VkvError(f"{where}: field 'query' must be a non-empty string")
    if not isinstance(code, str):
        raise VkvError(f"{where}: field 'code' must be a string")
    score = data.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0.0 <= score <= 1.0:
        raise VkvError(f"{where}: field 'score' must be a number in [0, 1], got {score!r}")
    kept = data.get("kept_frags")
    n = len(split_lines(code))
    if not isinstance(kept, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in kept):
        raise VkvError(f"{where}: field 'kept_frags' must be a list of 1-based line numbers")
    bad = [k for k in kept if not 1 <= k <= n]
    if bad:
        raise VkvError(f"{where}: field 'kept_frags' has line {bad[0]} outside 1..{n}")
    language = data.get("language", "python")
    if not isinstance(language, str) or not language:
        raise VkvError(f"{where}: field 'language' must be a non-empty string")
    return Record(query, code, tuple(sorted(set(kept))), float(score), language)


def write_records(path: str | Path, records: list[Record]) -> None:
    with atomic_path(path, "json") as tmp:  # JSON lines
        with open(tmp, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
