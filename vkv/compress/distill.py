"""Question-free distillation: tune what stands for a span (vkv's virtual embeddings, kvopt's free keys, values and
biases) so that the frozen model, reading it instead of the span, predicts the same next tokens on probe text as it
does when it reads the span itself.

Probes never involve evaluation questions: `continuation` is the conversation's own next tokens after the
span; `summary` is a generic request to summarise the conversation followed by the answer the model
generates with the full span in view; `repeat` is the span itself, teacher-forced after a request to repeat it, in
chunks (the reconstruction pass's read-out, the objective of Cartridges' self-study): the compressed context must
let the model re-read the span as the full context does. The loss is KL(full ‖ compressed) averaged over probe
tokens; with `step_tokens`, each step scores the next probes in turn, and the stage keeps its result only if the loss
over every probe fell.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from vkv.compress.reconstruction import read_out_feeds
from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.kv.ragged import RaggedCache
from vkv.kv.segment import verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM
from vkv.settings import check_ranges, setting
from vkv.stages import stage

PROBES = ("continuation", "summary", "repeat")
SUMMARY_REQUEST = (
    "Summarise the conversation so far. List every file, function, command, setting, value, error "
    "and decision with its exact name."
)


@dataclass
class DistillConfig:
    steps: int = setting(
        0, "after the fit, this many Adam steps on KL(full ‖ compressed) over probe text (0: off)", minimum=0
    )
    lr: float = setting(3e-3, "the distillation stage's learning rate", minimum=0, above=True)
    probes: tuple[str, ...] = setting(PROBES[:2], f"probe texts, from {', '.join(PROBES)}")
    probe_tokens: int = setting(
        64, "tokens scored per probe (the summary's request comes on top; repeat: the span's chunk length)", minimum=1
    )
    step_tokens: int = setting(
        0, "probe tokens scored per Adam step, the probes taken in turn (0: every probe at every step)", minimum=0
    )

    def validate(self) -> DistillConfig:
        unknown = set(self.probes) - set(PROBES)
        if unknown or not self.probes:
            raise VkvError(f"distill probes must be a non-empty subset of {', '.join(PROBES)}, got {self.probes}")
        check_ranges(self, prefix="distill_")
        return self


def distill_setting(name: str, default: Any) -> Any:
    """DistillConfig's setting `name` as a field of another method's config (kvopt's end-to-end stage), with that
    method's default: one declaration, so `vkv eval` gives both one flag."""
    declared = next(f for f in fields(DistillConfig) if f.name == name)
    return field(default=default, metadata=declared.metadata)


@dataclass
class Probe:
    ids: list[int]  # fed right after the span, at positions end, end + 1, ...
    teacher: torch.Tensor  # [len(ids), vocab] float32 log-probabilities with the full span in view


def summary_request_ids(tokenizer) -> list[int]:
    """A user turn asking for a summary plus the assistant prompt, as the chat template renders it mid-chat."""
    opening = [{"role": "user", "content": "-"}]
    before = tokenizer.apply_chat_template(opening, tokenize=False)
    after = tokenizer.apply_chat_template(
        opening + [{"role": "user", "content": SUMMARY_REQUEST}], tokenize=False, add_generation_prompt=True
    )
    if not after.startswith(before):
        raise VkvError(
            "the chat template rewrites earlier messages when one is appended; use --distill-probes continuation"
        )
    return tokenizer(after[len(before) :], add_special_tokens=False)["input_ids"]


def build_probes(
    lm: FrozenLM, ids: list[int], end: int, teacher: KVPrefix, config: DistillConfig, start: int | None = None
) -> list[Probe]:
    """Probe token sequences and the full-context model's log-probabilities on them (no gradients); `start`: where
    the span begins (the repeat probes')."""
    sequences = []
    if "repeat" in config.probes:
        if start is None:
            raise VkvError("the repeat probe needs the span's start")
        sequences += [fed for fed, _ in read_out_feeds(lm, list(ids[start:end]), start, config.probe_tokens)]
    if "continuation" in config.probes and end < len(ids):
        sequences.append(list(ids[end : end + config.probe_tokens]))
    if "summary" in config.probes:
        request = summary_request_ids(lm.tokenizer)
        sequences.append(request + _greedy(lm, teacher, end, request, config.probe_tokens))
    if not sequences:
        raise VkvError(
            "distillation has no probe text: the span ends the conversation and only 'continuation' was asked for"
        )
    with torch.no_grad():
        return [Probe(seq, _logprobs(lm, teacher, end, seq)) for seq in sequences]


def distill(
    lm: FrozenLM,
    prefix: KVPrefix,
    embeddings: torch.Tensor,
    positions: torch.Tensor,
    end: int,
    probes: list[Probe],
    config: DistillConfig,
    fixed: KVPrefix | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[float]]:
    """Adam on embeddings `[k, hidden]` to minimise the mean KL over probes; returns the best and the loss trace
    (`tune`'s). `fixed`: entries the context holds beside the virtual tokens (a per-head hybrid's verbatim part, whose
    bias masks what a head does not hold); `bias` `[layers, kv_heads, k]`: the virtual tokens' own per head."""
    x = embeddings.detach().to(lm.device, torch.float32).clone().requires_grad_(True)
    virtual_bias = None if bias is None else [b[None].to(lm.device) for b in bias]

    def entries() -> KVPrefix:
        keys, values = lm.forward_kv(x[None].to(lm.dtype), positions, prefix)
        return KVPrefix(keys, values, None, virtual_bias)

    trace = tune(lm, prefix if fixed is None else prefix.cat(fixed), entries, [x], end, probes, config)
    return x.detach().cpu(), trace


def tune(
    lm: FrozenLM,
    context: KVPrefix,
    entries: Callable[[], KVPrefix],
    params: list[torch.Tensor],
    end: int,
    probes: list[Probe],
    config: DistillConfig,
) -> list[float]:
    """`config.steps` Adam steps on `params` (leaf tensors that `entries()` turns into the span's compressed entries,
    read after `context`) to minimise the mean KL over probes; `params` end holding the best iterate. Returns the loss
    trace, per step; with probes taken in turn (`step_tokens`), losses on different probes do not compare, so the
    loss over every probe comes first and last and the result is kept only if it fell (else `params` go back to their
    start)."""
    with stage("end-to-end", lm.device):
        start = [p.detach().clone() for p in params]

        def loss(chosen: list[Probe]) -> torch.Tensor:
            return probe_loss(lm, context.cat(entries()), end, chosen)

        turns = _in_turn(probes, config.step_tokens)
        optimiser = torch.optim.Adam(params, lr=config.lr)
        best, best_loss, trace = start, math.inf, []
        if len(turns) > 1:
            with torch.no_grad():
                trace.append(float(loss(probes)))
        for step in range(config.steps + 1):
            if len(turns) > 1 and step == config.steps:
                break
            value = loss(turns[step % len(turns)])
            trace.append(float(value.detach()))
            if len(turns) == 1 and trace[-1] < best_loss:
                best, best_loss = [p.detach().clone() for p in params], trace[-1]
            if step == config.steps or not math.isfinite(trace[-1]):
                break
            optimiser.zero_grad(set_to_none=True)
            value.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimiser.step()
        if len(turns) > 1:
            with torch.no_grad():
                trace.append(float(loss(probes)))
            best = [p.detach().clone() for p in params] if trace[-1] < trace[0] else start
        with torch.no_grad():
            for param, kept in zip(params, best):
                param.copy_(kept)
        return trace


def probe_loss(lm: FrozenLM, context: KVPrefix, end: int, probes: list[Probe]) -> torch.Tensor:
    """The mean over `probes` of KL(full ‖ compressed) per token, the probes fed at `end` after `context`."""
    return sum(_kl(probe.teacher, _logprobs(lm, context, end, probe.ids)) for probe in probes) / len(probes)


def trace_summary(probes: list[Probe], trace: list[float]) -> dict:
    """What a run records of its distillation stage."""
    return {
        "probe_tokens": [len(p.ids) for p in probes],
        "initial_kl": trace[0],
        "best_kl": min(trace),
        "final_kl": trace[-1],
        "trace": trace,
    }


def _in_turn(probes: list[Probe], step_tokens: int) -> list[list[Probe]]:
    """The probes in consecutive groups of at most `step_tokens` tokens (each at least one probe); one group of all
    when `step_tokens` is 0."""
    if not step_tokens:
        return [probes]
    groups: list[list[Probe]] = [[]]
    for probe in probes:
        if groups[-1] and sum(len(p.ids) for p in groups[-1]) + len(probe.ids) > step_tokens:
            groups.append([])
        groups[-1].append(probe)
    return groups


def _kl(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    return (teacher.exp() * (teacher - student)).sum(-1).mean()


def _logprobs(lm: FrozenLM, context: KVPrefix, position: int, ids: list[int]) -> torch.Tensor:
    """Log-probabilities `[len(ids), vocab]` of the tokens after each of `ids`, fed at `position` on `context`."""
    cache = RaggedCache.from_prefix(context.to(lm.device, lm.dtype), position)  # autograd-tracked entries stay so
    n = len(ids)
    out = lm.model(
        input_ids=torch.tensor([ids], device=lm.device),
        position_ids=torch.arange(position, position + n, device=lm.device, dtype=torch.float32)[None],
        **lm.with_cache(cache),
        use_cache=True,
    )
    return torch.log_softmax(out.logits[0].float(), dim=-1)


def _greedy(lm: FrozenLM, context: KVPrefix, position: int, prompt: list[int], max_new: int) -> list[int]:
    """The full-context model's own greedy answer to the prompt (stops at an end-of-turn token)."""
    spliced = SplicedCache()
    spliced.append(verbatim_segment(context, 0))
    spliced.next_position = position
    return Context(lm, spliced).greedy(prompt, max_new)
