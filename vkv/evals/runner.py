"""Score methods on a transcript: full and none references once, then each method at a ratio.

Every method gets the same `SpanWork` (one full-context forward pass per transcript) and is measured the
same way: greedy answers (keyword accuracy), log-probabilities of the choices after the answer prefix
(choice accuracy, retention), next-token distributions over the question and answer (fidelity KL), and greedy
completions of each question's cloze form (recall kept, `vkv.evals.cloze`).
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from vkv.errors import VkvError
from vkv.evals.cloze import Cloze, cloze, cloze_correct, recall_summary
from vkv.evals.metrics import keyword_correct, kl_full_to_method, mean, retention
from vkv.evals.validate import leaks
from vkv.kv.prefix import KVPrefix
from vkv.kv.ragged import kv_row_bytes
from vkv.kv.segment import Segment, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.capture import capture_span
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM
from vkv.lm.splice import splice
from vkv.methods import Method, SpanWork
from vkv.methods.base import TextMethod
from vkv.settings import setting
from vkv.text.transcript import Question, Transcript, continuation_ids, followup, render
from vkv.version import __version__


@dataclass
class EvalSettings:
    min_gap: float = setting(
        1.0, "nats; questions whose full-vs-none gap is smaller are flagged, not averaged", minimum=0
    )
    max_new_tokens: int = setting(24, "longest greedy answer, in tokens", minimum=1)
    batch: int = setting(
        16,
        "questions scored side by side on one context, packed into one sequence after it (the context is shared, "
        "never copied): more is faster until the device is busy, and holds more tokens' logits at once; 0: each "
        "question alone, every choice in its own forward (the reference the side-by-side scoring is checked against)",
        minimum=0,
    )
    cloze: bool = setting(
        True,
        "also complete each question's cloze form (the words before its keyword in the session) greedily and report "
        "recall kept: the share a method completes of the clozes the full context completes",
    )
    seed: int = setting(0, cli=False, minimum=0)  # the run's seed (the optimiser's --seed), recorded with the result


@dataclass
class PreparedQuestion:
    question: Question
    prompt: list[int]  # question turn + assistant prompt + answer prefix, continuing the conversation
    choices: list[list[int]]  # each choice's ids as it follows the prompt; choices[0] is correct
    cloze: Cloze | None = None  # its cloze form; None when the settings ask for none
    cloze_prompt: list[int] | None = None  # the request to quote the line + the cloze prefix, where there is one


@dataclass
class Measurement:
    answer: str
    choice_logprobs: list[float]
    choice_mean_logprobs: list[float]
    fidelity_logp: torch.Tensor  # [positions, vocab]
    cloze_answer: str | None = None  # the greedy completion of the cloze prefix, where there is one


class TranscriptEval:
    """One transcript prepared for scoring: rendering, span, prompts, shared work and both references."""

    def __init__(
        self,
        lm: FrozenLM,
        transcript: Transcript,
        turns: tuple[int, int] | None = None,
        settings: EvalSettings | None = None,
        allow_leaks: bool = False,
    ):
        """`allow_leaks`: score questions whose answers the uncompressed messages or the question itself give away
        (refused otherwise, as `vkv validate` refuses them)."""
        self.lm, self.transcript = lm, transcript
        self.settings = settings or EvalSettings()
        self.turns = turns or transcript.default_span()
        self.rendered = render(transcript, lm.tokenizer, max_tokens=lm.max_positions)
        lm.check_positions(
            len(self.rendered.ids), f"{transcript.path or transcript.id} ({len(self.rendered.ids)} tokens)"
        )
        self.start, self.end = self.rendered.token_span(*self.turns)
        if not transcript.questions:
            raise VkvError(f"{transcript.path or transcript.id}: field questions: nothing to evaluate")
        leaking = [] if allow_leaks else leaks(transcript, self.turns)
        if leaking:
            raise VkvError(
                f"{leaking[0]}; {len(leaking)} such leak(s), which `vkv validate` lists (--allow-leaks scores them anyway)"
            )
        # derived once from the transcript as given: a text method's pruned rendering is asked the same clozes
        self.clozes = {q: cloze(q, transcript) for q in transcript.questions} if self.settings.cloze else {}
        self.questions = [self._prepare(q, self.rendered, transcript) for q in transcript.questions]
        self.measure_references()

    def measure_references(self) -> None:
        """The shared work for the span, then the reference methods, measured once: the span kept whole (full) and
        dropped (none)."""
        rendered = self.rendered
        self.work = SpanWork.capture(
            self.lm,
            rendered.ids,
            self.start,
            self.end,
            rendered.message_starts,
            rendered.message_roles,
            self.settings.seed,
        )
        self.full, full_memory = self.measure(self.splice(self.work.keep(list(range(self.end - self.start)))))
        self.none, none_memory = self.measure(self.splice(None))
        self.references = {"full": (self.full, full_memory), "none": (self.none, none_memory)}

    def _prepare(self, q: Question, rendered, transcript: Transcript) -> PreparedQuestion:
        prompt, text = followup(self.lm.tokenizer, rendered, transcript, q.question, q.answer_prefix)
        options = list(q.choices) or list(q.accept[:1])
        sep = " " if q.answer_prefix and not q.answer_prefix.endswith((" ", "\n")) else ""
        choices = [continuation_ids(self.lm.tokenizer, text, sep + c) for c in options]
        form = self.clozes.get(q)
        cloze_prompt = (
            followup(self.lm.tokenizer, rendered, transcript, form.request, form.prefix)[0]
            if form and form.usable
            else None
        )
        return PreparedQuestion(q, prompt, choices, form, cloze_prompt)

    # ---- building and measuring contexts ------------------------------------------------------
    def splice(self, segments: Segment | list[Segment] | None) -> SplicedCache:
        """System prefix verbatim, the method's segment (or segments, in span order), the rest re-encoded."""
        return splice(self.lm, self.work.kv, self.start, self.end, segments, self.rendered.ids[self.end :])

    def measure(
        self, spliced: SplicedCache, questions: list[PreparedQuestion] | None = None, alone: bool = False
    ) -> tuple[list[Measurement], dict[str, Any]]:
        """Each question scored on the cache, and what the cache holds in memory for the span. The questions are
        scored `settings.batch` at a time side by side; `alone` (or a batch of 0): one sequence at a time instead
        (`Context.score_alone`, the reference the batched scoring is checked and timed against)."""
        context = Context(self.lm, spliced)
        memory = self.memory(context.cache.span_nbytes(self.start, self.end), context.cache.nbytes)
        questions = questions or self.questions
        new_tokens = self.settings.max_new_tokens
        # each question's cloze rides along with it, answered only (no continuations): one more stream per question
        # in the same forwards, so its greedy tokens take no decoding steps of their own
        if alone or not self.settings.batch:
            scored = [context.score_alone(pq.prompt, pq.choices, new_tokens) for pq in questions]
            clozes = [context.score_alone(pq.cloze_prompt, [], new_tokens) for pq in questions if pq.cloze_prompt]
        else:
            scored, clozes = [], []
            for first in range(0, len(questions), self.settings.batch):
                chunk = questions[first : first + self.settings.batch]
                asked = [(pq.prompt, pq.choices) for pq in chunk] + [
                    (pq.cloze_prompt, []) for pq in chunk if pq.cloze_prompt
                ]
                answered = context.score(asked, new_tokens)
                scored, clozes = scored + answered[: len(chunk)], clozes + answered[len(chunk) :]
        decode = lambda ids: self.lm.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        completions = iter(clozes)
        results = [
            Measurement(
                answer=decode(s.answer),
                choice_logprobs=[float(x.sum()) for x in s.logprobs],
                choice_mean_logprobs=[float(x.mean()) for x in s.logprobs],
                fidelity_logp=s.fidelity,
                cloze_answer=decode(next(completions).answer) if pq.cloze_prompt else None,
            )
            for pq, s in zip(questions, scored)
        ]
        return results, memory

    def memory(self, span_bytes: int, cache_bytes: int, span_tokens: int | None = None) -> dict[str, Any]:
        """Bytes in memory: the decoding cache's (`cache_memory_bytes`, measured from its tensors), those it holds
        for the span's entries (`span_memory_bytes`: keys, values, biases and per-head offsets), the span's full K/V
        in the same dtype (`span_full_bytes`), and `ratio_memory`, the second over the third."""
        layers, heads, _ = self.lm.cache_shape
        per_token = (
            kv_row_bytes(self.lm.cache_shape, torch.empty(0, dtype=self.lm.dtype).element_size()) * layers * heads
        )
        full = (self.end - self.start) * per_token
        if span_tokens is not None:  # a text method's pruned span, prefilled verbatim: its tokens' K/V
            span_bytes = span_tokens * per_token
        return {
            "cache_memory_bytes": cache_bytes,
            "span_memory_bytes": span_bytes,
            "span_full_bytes": full,
            "ratio_memory": round(full / span_bytes, 4) if span_bytes else None,
        }

    # ---- scoring ---------------------------------------------------------------------------------
    def evaluate(self, method: Method, ratio: float | None, on_step: Callable | None = None) -> dict[str, Any]:
        torch.manual_seed(self.settings.seed)
        if isinstance(method, TextMethod):
            return self._evaluate_text(method, ratio or 1.0)
        self.work.take_reused_seconds()
        started = time.perf_counter()
        segment = method.compress(self.work, ratio or 1.0, on_step)
        measured = self.references[method.name] if method.reference else None
        # what compressing at this ratio alone takes: work shared with earlier runs on this window counts again
        seconds = time.perf_counter() - started + self.work.take_reused_seconds()
        spliced = self.splice(segment)
        measured, memory = measured or self.measure(spliced)
        return self.result(
            method.name,
            method.config(),
            method.question_aware,
            ratio,
            spliced.span_entries(self.start, self.end),
            measured,
            seconds,
            segment.stats if segment is not None else {},
            slots=spliced.span_entries(self.start, self.end, padded=True),
            memory=memory,
        )

    def _evaluate_text(self, method: TextMethod, ratio: float) -> dict[str, Any]:
        """Prune the span's messages as text, re-render the shorter conversation and prefill it verbatim. A
        question-aware method prunes once per question (query = that question) and is scored on it alone."""
        first, last = self.turns
        if method.question_aware:
            runs = [
                self._prune_and_measure(method, ratio, [pq.question.question] * (last - first), [pq])
                for pq in self.questions
            ]
        else:
            queries = [self.latest_request(upto=turn + 1) for turn in range(first, last)]
            runs = [self._prune_and_measure(method, ratio, queries, self.questions)]
        measured = [m for run in runs for m in run["measured"]]
        entries = round(mean(run["entries"] for run in runs))
        seconds = sum(run["seconds"] for run in runs)
        stats = {"text_report": [run["report"] for run in runs]}
        memory = self.memory(0, round(mean(run["cache_bytes"] for run in runs)), span_tokens=entries)
        return self.result(
            method.name, method.config(), method.question_aware, ratio, entries, measured, seconds, stats, memory=memory
        )

    def _prune_and_measure(
        self, method: TextMethod, ratio: float, queries: list[str], questions: list[PreparedQuestion]
    ) -> dict[str, Any]:
        """Prune the span's messages (`queries[i]`: the query known when span message i ends), re-render, measure."""
        first, last = self.turns
        messages = list(self.transcript.messages)
        started = time.perf_counter()
        contents = method.prune_span(self.lm, messages[first:last], queries, ratio)
        seconds = time.perf_counter() - started
        pruned = [replace(m, content=c if c.strip() else "…") for m, c in zip(messages[first:last], contents)]
        shorter = replace(self.transcript, messages=tuple(messages[:first] + pruned + messages[last:]))
        rendered = render(shorter, self.lm.tokenizer)
        start, end = rendered.token_span(first, last)
        _, cache = capture_span(self.lm, rendered.ids, 0, len(rendered.ids), keep_cache=True)
        spliced = SplicedCache()
        spliced.append(verbatim_segment(KVPrefix.from_cache(cache), 0))
        prepared = [self._prepare(pq.question, rendered, shorter) for pq in questions]
        report = {"query": queries[-1], "messages": dropped_lines(messages[first:last], contents, first)}
        measured, memory = self.measure(spliced, prepared)
        return {
            "measured": measured,
            "cache_bytes": memory["cache_memory_bytes"],
            "entries": end - start,
            "seconds": seconds,
            "report": report,
        }

    def latest_request(self, upto: int | None = None) -> str:
        """The most recent user message before message `upto` (default: the span's end): the question-agnostic
        query for text pruners."""
        users = [m.content for m in self.transcript.messages[: upto or self.turns[1]] if m.role == "user"]
        return users[-1] if users else self.transcript.messages[0].content

    def evaluate_cache(self, spliced: SplicedCache, label: str = "cache") -> dict[str, Any]:
        if spliced.next_position != len(self.rendered.ids):
            raise VkvError(
                f"cache stands for {spliced.next_position} tokens but the transcript renders to "
                f"{len(self.rendered.ids)}; was it built from this transcript with the default span?"
            )
        measured, memory = self.measure(spliced)
        return self.result(
            label,
            spliced.meta.get("config", {}),
            False,
            None,
            spliced.span_entries(self.start, self.end),
            measured,
            0.0,
            {},
            slots=spliced.span_entries(self.start, self.end, padded=True),
            memory=memory,
        )

    def result(
        self, name, config, question_aware, ratio, entries, measured, seconds, stats, slots=None, memory=None
    ) -> dict[str, Any]:
        """One run's record; `entries` are the span's entries per KV head (saved as `compressed_entries`), `slots`
        its slots per layer and KV head (saved as `stored_entries`; more with head-wise budgets' padding; default:
        `entries`), `memory` what the decoding cache holds in bytes (`memory()`)."""
        questions = [self._score(pq, m, f, n) for pq, m, f, n in zip(self.questions, measured, self.full, self.none)]
        usable = [q for q in questions if not q["weak"]]
        return {
            **self.run_record(name, config, question_aware, ratio, entries, seconds, stats, slots, memory),
            "eval": asdict(self.settings),
            "questions": questions,
            "summary": {
                "keyword_accuracy": mean(float(q["keyword_correct"]) for q in questions),
                "choice_accuracy": mean(float(q["choice_correct"]) for q in questions),
                "choice_accuracy_normalised": mean(float(q["choice_correct_normalised"]) for q in questions),
                "mean_retention": mean(q["retention"] for q in usable),
                "fidelity_kl": mean(q["fidelity_kl"] for q in questions),
                "questions": len(questions),
                "weak_questions": len(questions) - len(usable),
                **recall_summary(questions),
            },
        }

    def run_record(
        self, name, config, question_aware, ratio, entries, seconds, stats, slots=None, memory=None
    ) -> dict[str, Any]:
        """What every run's record holds however it was scored: the unit, the method and its config, the ratio asked
        and achieved, the entries and bytes kept, the seconds and the optimiser's statistics (`result`'s arguments)."""
        span_tokens = self.end - self.start
        return {
            "transcript": self.transcript.id,
            "split": self.transcript.split,
            "method": name,
            "model": self.lm.name,
            "quant": self.lm.quant,
            "ratio_requested": ratio,
            "ratio_achieved": round(span_tokens / entries, 4) if entries else None,
            "span_tokens": span_tokens,
            "compressed_entries": entries,
            "stored_entries": entries if slots is None else slots,
            **(memory or {}),
            "seconds": round(seconds, 3),
            "question_aware": question_aware,
            "turns": list(self.turns),
            "config": config,
            "vkv_version": __version__,
            "optimisation": {k: v for k, v in stats.items() if k not in ("trace", "text_report")} if stats else {},
            "loss_trace": stats.get("trace", []) if stats else [],
            **({"text_report": stats["text_report"]} if "text_report" in stats else {}),
        }

    def distance(self, q: Question) -> tuple[int | None, int | None]:
        """Tokens and messages between the question's latest source turn inside the compressed span (its nearest
        evidence) and the span's end; None when no source turn is inside the span."""
        return self.rendered.evidence_distance(q.source_turns, self.turns)

    def _score(self, pq: PreparedQuestion, m: Measurement, full: Measurement, none: Measurement) -> dict[str, Any]:
        q = pq.question
        lp, lp_full, lp_none = m.choice_logprobs[0], full.choice_logprobs[0], none.choice_logprobs[0]
        gap = lp_full - lp_none
        tokens, turns = self.distance(q)
        return {
            "id": q.id,
            "kind": q.kind,
            "distance_tokens": tokens,
            "distance_turns": turns,
            "answer": m.answer,
            "keyword_correct": keyword_correct(m.answer, q.accept, q.reject),
            "choice_correct": _argmax(m.choice_logprobs) == 0,
            "choice_correct_normalised": _argmax(m.choice_mean_logprobs) == 0,
            "answer_logprob": round(lp, 4),
            "choice_logprobs": [round(x, 4) for x in m.choice_logprobs],
            "gap": round(gap, 4),
            "weak": gap < self.settings.min_gap,
            "retention": _round(retention(lp, lp_none, lp_full)),
            "fidelity_kl": round(kl_full_to_method(full.fidelity_logp, m.fidelity_logp), 5),
            **self._score_cloze(pq, m, full),
        }

    def _score_cloze(self, pq: PreparedQuestion, m: Measurement, full: Measurement) -> dict[str, Any]:
        """The cloze's fields of a question's record (none when the settings ask for no cloze): its prefix, or why it
        has none, the completion, whether it is correct, and whether the question counts for recall (the full
        context's completion is correct)."""
        if pq.cloze is None:
            return {}
        if not pq.cloze.usable:
            return {"cloze_prefix": None, "cloze_skipped": pq.cloze.why, "recall_counts": False}
        return {
            "cloze_prefix": pq.cloze.prefix,
            "cloze_answer": m.cloze_answer,
            "cloze_correct": cloze_correct(m.cloze_answer, pq.question),
            "recall_counts": cloze_correct(full.cloze_answer, pq.question),
        }


def dropped_lines(messages: list, contents: list[str], first: int) -> list[dict[str, Any]]:
    """Per pruned message: its index, role, lines before and after, and the original lines that did not survive
    (in order), so a reader sees what a text backend threw away."""
    report = []
    for index, (message, content) in enumerate(zip(messages, contents), start=first):
        before, after = message.content.splitlines(), content.splitlines()
        matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
        kept = {i for block in matcher.get_matching_blocks() for i in range(block.a, block.a + block.size)}
        report.append(
            {
                "message": index,
                "role": message.role,
                "lines": len(before),
                "lines_kept": len(kept),
                "dropped": [line for i, line in enumerate(before) if i not in kept],
            }
        )
    return report


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)
