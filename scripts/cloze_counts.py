"""How many questions count for recall: per session window, the questions whose cloze form (vkv.evals.cloze) the
full context completes with its keyword, and why the others have no cloze form. Windows, model and answer length
come from an experiment file, as its sweep evaluates them; transcripts given on the command line replace its list.

    python scripts/cloze_counts.py experiments/anchors-faithful-long-test.toml                  # its 5 test sessions
    python scripts/cloze_counts.py experiments/anchors-faithful-long-test.toml transcripts/long/test/*.json
    python scripts/cloze_counts.py experiments/anchors-faithful-long-test.toml transcripts/long/dev/*.json --wordings

`--wordings` completes every cloze after each candidate request below instead of the eval's own (`cloze.REQUEST`):
how the request was chosen, on the dev split only. The full context is the window prefilled whole, the cache
`vkv eval`'s full reference holds.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

from vkv.evals import cloze as cloze_module
from vkv.evals.cloze import cloze, cloze_correct
from vkv.evals.metrics import keyword_correct
from vkv.evals.runner import EvalSettings
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.capture import capture_span
from vkv.lm.context import Context
from vkv.lm.load import load_model
from vkv.sweep.grid import load_experiment
from vkv.text.transcript import followup, load_transcript, render
from vkv.text.windows import select_windows

# Cloze forms compared on the dev split (--wordings): (request, prefix characters, prefix across line breaks). A
# request that repeats the prefix loses: the model copies from its nearest occurrence, the request itself, so the
# later requests leave it to the answer.
WORDINGS = {
    # requests that repeat the prefix ({prefix}): the first round, on one dev session, before the others
    "quote-repeating-line-60": (
        "Quote, word for word, the line from this session that begins with these words: {prefix}",
        60,
        False,
    ),
    "complete-repeating-line-60": (
        "Complete this line from earlier in the session, exactly as it was written: {prefix}",
        60,
        False,
    ),
    "repeat-quoted-line-60": ('Repeat the line from this session that contains the words "{prefix}".', 60, False),
    "continue-line-60": ("Continue the text.", 60, False),
    "quote-line-60": (cloze_module.REQUEST, 60, False),
    "quote-line-160": (cloze_module.REQUEST, 160, False),  # the quote request, 160 chars of the keyword's line
    "quote-160": (cloze_module.REQUEST, 160, True),  # ... 160 chars reaching into earlier lines
    "continue-160": ("Continue the text.", 160, True),
    "quote-320": (cloze_module.REQUEST, 320, True),
    "quote-640": (cloze_module.REQUEST, 640, True),
}


def full_context(lm, ids: list[int]) -> Context:
    """The window's whole rendering prefilled: the full reference's cache."""
    _, cache = capture_span(lm, ids, 0, len(ids), keep_cache=True)
    spliced = SplicedCache()
    spliced.append(verbatim_segment(KVPrefix.from_cache(cache), 0))
    return Context(lm, spliced)


def completions(lm, context, rendered, window, forms, request: str, settings: EvalSettings) -> list[str]:
    """Each cloze's greedy completion after `request` (its {prefix}, if any, filled) and its prefix, `settings.batch` at a time."""
    prompts = [followup(lm.tokenizer, rendered, window, request.format(prefix=f.prefix), f.prefix)[0] for f in forms]
    out = []
    for first in range(0, len(prompts), settings.batch):
        scored = context.score([(p, []) for p in prompts[first : first + settings.batch]], settings.max_new_tokens)
        out += [lm.tokenizer.decode(s.answer, skip_special_tokens=True) for s in scored]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", help="the experiment file whose model, windows and [eval] settings to use")
    parser.add_argument("transcripts", nargs="*", help="transcripts instead of the experiment's")
    parser.add_argument(
        "--wordings",
        nargs="?",
        const=",".join(WORDINGS),
        help="compare these candidate cloze forms, comma-separated (default: all of them; on dev only)",
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument("--show", action="store_true", help="print every cloze prefix and completion")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    experiment = load_experiment(args.experiment)
    defaults = experiment.grids[0]
    paths = args.transcripts or [str(experiment.resolve(t)) for t in defaults["transcripts"]]
    settings = EvalSettings(**{k: v for k, v in experiment.eval.items() if k in EvalSettings.__dataclass_fields__})
    lm = load_model(defaults["model"], quant=defaults.get("quant", "auto"))
    wordings = (
        {name: WORDINGS[name] for name in args.wordings.split(",")}
        if args.wordings
        else {"eval": (cloze_module.REQUEST, cloze_module.MAX_CHARS, cloze_module.LINES)}
    )
    started = time.perf_counter()
    totals: Counter = Counter()
    skipped: Counter = Counter()
    for path in paths:
        transcript = load_transcript(path)
        if args.wordings and transcript.split != "dev":
            raise SystemExit(f"{path}: --wordings chooses the cloze form, on dev transcripts only")
        rendered = render(transcript, lm.tokenizer, max_tokens=lm.max_positions)
        for window in select_windows(transcript, rendered, defaults["window"], defaults.get("max_windows")):
            rendered_window = render(window, lm.tokenizer, max_tokens=lm.max_positions)
            context = full_context(lm, rendered_window.ids)
            cells = [f"{window.id}: {len(window.questions)} questions"]
            totals["questions"] += len(window.questions)
            for name, (request, max_chars, lines) in wordings.items():
                pairs = [(q, cloze(q, window, max_chars, lines)) for q in window.questions]
                usable = [(q, f) for q, f in pairs if f.usable]
                skipped.update((name, f.why) for _, f in pairs if not f.usable)
                answers = completions(lm, context, rendered_window, window, [f for _, f in usable], request, settings)
                correct = sum(cloze_correct(a, q) for (q, _), a in zip(usable, answers))
                anywhere = sum(keyword_correct(a, q.accept, q.reject) for (q, _), a in zip(usable, answers))
                totals[name] += correct
                totals[f"{name} usable"] += len(usable)
                totals[f"{name} anywhere"] += anywhere
                cells.append(f"{name}: {correct} of {len(usable)} (keyword anywhere {anywhere})")
                if args.show:
                    for (q, f), a in zip(usable, answers):
                        mark = "+" if cloze_correct(a, q) else "-"
                        print(f"  {mark} [{name}] {q.id} {f.prefix[-60:]!r} -> {a!r} (accept {q.accept[0]!r})")
            print("; ".join(cells), flush=True)
    print(
        f"\n{len(paths)} transcript(s), {totals['questions']} questions ({settings.max_new_tokens} new tokens, "
        f"{time.perf_counter() - started:.0f} s after the model loaded)"
    )
    for name in wordings:
        print(
            f"count for recall ({name}): {totals[name]} of {totals[f'{name} usable']} with a cloze form (the "
            f"completion opens with the keyword; keyword anywhere in it: {totals[f'{name} anywhere']})"
        )
    for (name, why), n in sorted(skipped.items()):
        print(f"no cloze form ({name}), {why}: {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
