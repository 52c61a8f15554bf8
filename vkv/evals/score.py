"""Score a compressed context without questions: hold out a conversation's last messages, compress the history before
them, and measure how well the model still predicts the held-out assistant tokens.

The held-out messages are the conversation's own continuation, tokenised exactly as the whole conversation renders,
so the full history's prediction of them is the model's prediction of what really came next. Each context (the
method's compressed history, the full history, no history) is given the held-out tokens teacher-forced, and only the
tokens of held-out assistant messages are scored: tool output and user text are context, not predictions, and the
tokens a chat template writes to prompt the assistant are given to a model, not predicted by it. A method is given the
history's work exactly as `vkv eval` gives it a span (`SpanWork.capture`, then `splice`), and never sees the held-out
messages: its work is built from the history's own rendering.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from vkv.compress.budget import DEFAULT_METHOD, span_budget
from vkv.errors import VkvError
from vkv.evals.metrics import kl_full_to_method, retention
from vkv.evals.runner import TranscriptEval
from vkv.kv.spliced import SplicedCache
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM
from vkv.methods import Method, get_method
from vkv.settings import setting
from vkv.text.transcript import Transcript, assistant_prompt_length, render


@dataclass
class ScoreSettings:
    holdout: int | None = setting(
        None,
        "hold out the conversation's last N messages, which must hold an assistant message; default: the last "
        "assistant message and any after it. Only the held-out assistant tokens are scored",
        minimum=1,
        metavar="N",
    )
    seed: int = setting(0, cli=False, minimum=0)  # the run's seed (the optimiser's --seed), recorded with the result


@dataclass
class HeldOut:
    """One context's prediction of the scored held-out tokens: the log-distributions before each `[scored, vocab]`
    (on the host) and the log-probability of each actual token `[scored]`."""

    logp: torch.Tensor
    token_logp: torch.Tensor


def held_out_turn(transcript: Transcript, holdout: int | None) -> int:
    """The first held-out message: that of the last `holdout` messages, or by default the last assistant message. At
    least one message after the system message stays in the history (there is something to compress), and the
    held-out ones hold an assistant message (there is something to predict)."""
    where = transcript.path or transcript.id
    messages, first = transcript.messages, transcript.default_span()[0]
    history = len(messages) - first  # the messages after the system message
    if holdout is None:
        assistants = [i for i in range(first + 1, len(messages)) if messages[i].role == "assistant"]
        if not assistants:
            raise VkvError(
                f"{where}: no assistant message follows another message after the system message, so there is no "
                "reply to hold out and predict (--holdout N holds out the last N messages)"
            )
        return assistants[-1]
    if holdout < 1 or holdout >= history:
        raise VkvError(
            f"{where}: --holdout {holdout} must hold out at least 1 message and leave one to compress: it has "
            f"{history} message(s) after the system message, so at most {history - 1}"
        )
    turn = len(messages) - holdout
    if not any(m.role == "assistant" for m in messages[turn:]):
        raise VkvError(
            f"{where}: --holdout {holdout}: the last {holdout} message(s) hold no assistant message to predict"
        )
    return turn


class ScoreEval(TranscriptEval):
    """A transcript prepared for scoring held-out messages: the history (what methods compress, every message after
    the system message up to the held-out ones), the held-out ids and which of them are scored, the shared work and
    both references. `evaluate(method, ratio)` gives the method's record, as `TranscriptEval` does."""

    def __init__(self, lm: FrozenLM, transcript: Transcript, settings: ScoreSettings | None = None):
        self.lm, self.settings = lm, settings or ScoreSettings()
        where = transcript.path or transcript.id
        whole = render(transcript, lm.tokenizer, max_tokens=lm.max_positions)
        lm.check_positions(len(whole.ids), f"{where} ({len(whole.ids)} tokens)")
        turn = held_out_turn(transcript, self.settings.holdout)
        self.held_turns = (turn, len(transcript.messages))
        self.transcript = replace(transcript, messages=transcript.messages[:turn], questions=())
        self.rendered = render(self.transcript, lm.tokenizer)
        self.cut = whole.spans[turn].start
        if self.rendered.ids != whole.ids[: self.cut]:
            raise VkvError(
                f"{where}: the chat template renders the messages before the held-out ones differently without them, "
                "so the held-out tokens would not continue the history a method compresses"
            )
        self.held = whole.ids[self.cut :]
        # positions within `held`; the first held-out token is predicted inside the compressed span, where no
        # context gives its distribution, so it is never scored
        self.scored = [
            position - self.cut
            for span in whole.spans[turn:]
            if span.role == "assistant"
            for position in range(
                span.start + assistant_prompt_length(lm.tokenizer, whole, transcript, span.turn), span.end
            )
            if position > self.cut
        ]
        if not self.scored:
            raise VkvError(f"{where}: the held-out assistant messages render to no token to predict")
        self.turns = self.transcript.default_span()
        self.start, self.end = self.rendered.token_span(*self.turns)
        self.questions = []
        self.measure_references()

    def evaluate(self, method: Method, ratio: float | None, on_step: Callable | None = None) -> dict[str, Any]:
        if method.question_aware:
            raise VkvError(
                f"method '{method.name}' is question-aware (it is given an evaluation question), and a held-out "
                "continuation has none"
            )
        return super().evaluate(method, ratio, on_step)

    def measure(self, spliced: SplicedCache, questions=None, alone: bool = False) -> tuple[list[HeldOut], dict]:
        """The held-out tokens teacher-forced on the cache (the history, compressed or not): the scored tokens'
        predictions, and what the cache holds in memory for the history's span (before the held-out tokens)."""
        context = Context(self.lm, spliced)
        memory = self.memory(context.cache.span_nbytes(self.start, self.end), context.cache.nbytes)
        logits = context.feed(self.held[:-1])  # row i predicts held[i + 1]
        logp = torch.log_softmax(logits[torch.tensor(self.scored) - 1], -1).cpu()
        del logits
        targets = torch.tensor([self.held[i] for i in self.scored])
        return [HeldOut(logp, logp.gather(-1, targets[:, None])[:, 0])], memory

    def result(
        self, name, config, question_aware, ratio, entries, measured, seconds, stats, slots=None, memory=None
    ) -> dict[str, Any]:
        """One run's record (`TranscriptEval.run_record`) with the held-out messages and the summary: `kl` the mean
        per-token KL(full ‖ method), `ll` the scored tokens' summed log-likelihood (with the full and no history's),
        `kept` = (ll − ll_none) / (ll_full − ll_none), the share of the full history's gain kept (None without one)."""
        (method,), (full,), (none,) = measured, self.full, self.none
        ll, ll_full, ll_none = (float(m.token_logp.sum()) for m in (method, full, none))
        kept = retention(ll, ll_none, ll_full)
        return {
            **self.run_record(name, config, question_aware, ratio, entries, seconds, stats, slots, memory),
            "score": asdict(self.settings),
            "seed": self.settings.seed,
            "held_out": {
                "messages": list(self.held_turns),
                "tokens": len(self.held),
                "scored_tokens": len(self.scored),
            },
            "summary": {
                "kl": round(kl_full_to_method(full.logp, method.logp), 5),
                "ll": round(ll, 4),
                "ll_full": round(ll_full, 4),
                "ll_none": round(ll_none, 4),
                "ll_per_token": round(ll / len(self.scored), 5),
                "kept": None if kept is None else round(kept, 4),
            },
        }


def score(
    model,
    tokenizer,
    messages: Transcript | Sequence[Mapping[str, Any]] | str | Path,
    method: str | Method = DEFAULT_METHOD,
    ratio: float = 8.0,
    holdout: int | None = None,
    seed: int = 0,
    **options: Any,
) -> dict[str, Any]:
    """How much of a conversation a method keeps, with no questions: the last messages are held out (`holdout`: the
    last N; default the last assistant message and any after it), every message after the system message before them
    is compressed by `method` (a registered name with its `options`, or a Method) at `ratio` span tokens per entry,
    and the held-out assistant tokens are predicted teacher-forced from the compressed history, the full history and
    none. `model`: a transformers causal LM (or a vkv FrozenLM, with `tokenizer` None); `messages`: any format
    `vkv.load_conversation` reads. Returns the run's record, as one entry of `vkv score --json`: its `summary` holds
    `kl` (mean per-token KL(full ‖ method)), `ll`, `ll_full`, `ll_none` (the scored tokens' log-likelihoods) and
    `kept` = (ll − ll_none) / (ll_full − ll_none)."""
    from vkv.api.compress import frozen
    from vkv.text.formats import load_conversation

    lm = model if isinstance(model, FrozenLM) else frozen(model, tokenizer)
    chosen = method if isinstance(method, Method) else get_method(method, **options)
    evaluation = ScoreEval(lm, load_conversation(messages), ScoreSettings(holdout=holdout, seed=seed))
    if chosen.uses_ratio:
        span_budget(evaluation.end - evaluation.start, ratio)
    return evaluation.evaluate(chosen, ratio if chosen.uses_ratio else None)
