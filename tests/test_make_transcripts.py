"""scripts/make_transcripts.py: deterministic, and what it writes validates."""

import subprocess
import sys

from tests.conftest import ROOT
from vkv.evals.validate import check_static
from vkv.text.transcript import load_transcript


def generate(out):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_transcripts.py"), "--out", str(out), "--seed", "0"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.json"))}


def test_generator_is_deterministic_and_its_transcripts_validate(tmp_path):
    first, second = generate(tmp_path / "a"), generate(tmp_path / "b")
    assert first == second and len(first) == 26  # 12 short files, and the long split's 10 test and 4 dev ones
    assert {name.rsplit("/", 1)[0] for name in first} == {"dev", "test", "long/dev", "long/test"}
    for name in first:
        transcript = load_transcript(tmp_path / "a" / name)
        assert check_static(transcript).problems == [], name
        assert {q.kind for q in transcript.questions} == {"decision", "tool_output", "change"}
