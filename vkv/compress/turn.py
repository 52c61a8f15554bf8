"""A turn of a conversation (messages [first, last) over token ids [start, end)) and what the model computes for its
real tokens fed on top of a running cache: the pieces every turn-by-turn loop shares (vkv's, each method's, a
Session's) and what a method is given for one turn (compress/work.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.capture import Activations, projection_hooks
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM


@dataclass(frozen=True)
class Turn:
    """Messages [first, last) of a conversation occupying token ids [start, end)."""

    first: int
    last: int
    role: str | None
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def label(self) -> str:
        return str(self.first) if self.last == self.first + 1 else f"{self.first}-{self.last - 1}"


def message_turns(message_starts: list[int], roles: list[str] | None, start: int, end: int) -> list[Turn]:
    """One Turn per message overlapping token range [start, end) (the first may begin at `start`)."""
    turns = []
    for i, s in enumerate(message_starts):
        e = message_starts[i + 1] if i + 1 < len(message_starts) else None
        lo, hi = max(s, start), min(e if e is not None else end, end)
        if lo < hi:
            turns.append(Turn(i, i + 1, roles[i] if roles else None, lo, hi))
    return turns


def chunk_turns(turns: list[Turn], every: int) -> list[Turn]:
    """Consecutive turns gathered into chunks as an agent's loop meets them: a chunk closes once it holds at least
    `every` tokens (the last one may hold fewer); a chunk of one turn is that turn."""
    chunks, group = [], []
    for turn in turns:
        group.append(turn)
        if group[-1].end - group[0].start >= every or turn is turns[-1]:
            first, last = group[0], group[-1]
            chunks.append(first if len(group) == 1 else Turn(first.first, last.last, None, first.start, last.end))
            group = []
    return chunks


def split_recent(turns: list[Turn], recent: int) -> tuple[list[Turn], list[Turn]]:
    """(the turns to compress, the trailing ones kept verbatim): a turn that starts within the last `recent` tokens
    of the turns stays as it is, as an agent keeps its recent turns."""
    end = turns[-1].end if turns else 0
    older = [t for t in turns if t.start < end - recent]
    return older, turns[len(older) :]


@dataclass
class TurnView:
    """A turn's real tokens as the model computed them on top of some history."""

    acts: Activations  # V, pre-RoPE K and surprisal over [start, end)
    kv: KVPrefix  # the turn's own K/V, `[1, kv_heads, length, head_dim]` per layer

    def verbatim(self) -> Segment:
        return verbatim_segment(self.kv, self.acts.start)


def view_on_cache(lm: FrozenLM, cache: SplicedCache, ids: list[int], turn: Turn, queries: bool = False) -> TurnView:
    """Feed the turn's real tokens on top of the running cache (not changing it) and record what they give
    (with `queries`, the turn's pre-RoPE queries too)."""
    if cache.next_position != turn.start:
        raise VkvError(
            f"the running cache ends at position {cache.next_position}, not at the turn's start {turn.start}"
        )
    context = Context(lm, cache)
    with projection_hooks(lm, 0, turn.length, queries) as store:
        logits = context.feed(ids[turn.start : turn.end])
    turn_ids = torch.tensor(ids[turn.start : turn.end])
    nll = -torch.log_softmax(logits[:-1], -1).gather(-1, turn_ids[1:, None].to(logits.device))[:, 0].cpu()
    surprisal = torch.cat([torch.full((1,), float("nan")), nll])  # the first token's predictor is not kept
    values, keys = torch.stack(store["values"]), torch.stack(store["keys_pre_rope"])
    acts = Activations(
        values, keys, surprisal, turn.start, turn.end, torch.stack(store["queries_pre_rope"]) if queries else None
    )
    return TurnView(acts, context.cache.fed())
