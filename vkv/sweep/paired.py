"""`vkv report --vs`: each variant's paired difference from a reference variant, question by question."""

from __future__ import annotations

from typing import Any

from vkv.errors import VkvError
from vkv.evals.intervals import paired_difference
from vkv.sweep.variants import REFERENCES, SweepResults, groups, question_values


def paired(results: SweepResults, vs: str) -> list[dict[str, Any]]:
    """Every variant's paired difference from the reference `vs` (a variant label, or a method with one variant)
    at the same requested ratio (or the reference's only row, for full/none), on the questions both were scored
    on: retention (usable questions), recall kept (questions that count for recall) and choice accuracy, each with its
    window-bootstrap interval. `LABEL@RATIO`
    takes the reference's row at that ratio for every row (an ablation at another ratio: kvzip@10.667)."""
    grouped = groups(results)
    name, at = _reference_ratio(vs)
    matches = [key for key in grouped if key[0] == name] or [
        key for key in grouped if grouped[key][0]["run"]["method"] == name
    ]
    if len({variant for variant, _ in matches}) != 1:
        known = ", ".join(sorted({v for v, _ in grouped}))
        what = "names no run" if not matches else "matches several variants; name one"
        raise VkvError(f"--vs {vs}: {what} (variants: {known})")
    if at is not None:
        if not any(ratio == at for _, ratio in matches):
            ran = ", ".join(f"{r:g}" for _, r in matches if r is not None) or "none"
            raise VkvError(f"--vs {vs}: {matches[0][0]} has no run at {at:g}x (ratios: {ran})")
        matches = [key for key in matches if key[1] == at]
    references = {ratio: grouped[(variant, ratio)] for variant, ratio in matches}
    out = []
    for (variant, ratio), group in grouped.items():
        reference = references.get(ratio) or (references.get(None) if len(references) == 1 else None)
        if at is not None:  # one reference row for every ratio
            reference = references[at]
        if reference is None or (variant, ratio) in matches or group[0]["run"]["method"] in REFERENCES:
            continue
        diffs = {
            metric: paired_difference(question_values(group, metric), question_values(reference, metric))
            for metric in ("retention", "cloze_correct", "choice_correct")
        }
        out.append(
            {
                "variant": variant,
                "ratio_requested": ratio,
                "reference": reference[0]["variant"] + ("" if at is None else f" @{at:g}x"),
                "retention": diffs["retention"],
                "recall": diffs["cloze_correct"],
                "choice": diffs["choice_correct"],
            }
        )
    return sorted(out, key=lambda r: (r["ratio_requested"] or 0.0, r["variant"]))


def _reference_ratio(vs: str) -> tuple[str, float | None]:
    """`--vs`'s reference and, after an `@`, the one requested ratio to compare every row with (None: each row's own)."""
    name, sep, ratio = vs.rpartition("@")
    if not sep:
        return vs, None
    try:
        return name, float(ratio)
    except ValueError:
        raise VkvError(f"--vs {vs}: after '@' comes a requested ratio, e.g. kvzip@10.667") from None
