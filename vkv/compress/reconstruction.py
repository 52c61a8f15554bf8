"""The question-free reconstruction pass (KVzip's trick): after the context, the model is asked to repeat the span
and reads it out again; the queries of that read-out attend to the span the way a request that needs the span
would. They score entries (KVzip: the most attention an entry receives) and serve as reference queries.

The span's K/V are the ones the model computed for it in its context (not computed again), and a long span is read
out in chunks, as KVzip does: every chunk is fed on top of the whole span (the fed tokens of the previous chunk
removed first), the first after "repeat the previous context", each later one after "repeat the part … starting
with" and the last few tokens before it. So the pass needs the span's positions plus one chunk's, not twice the
span's, and its memory is one chunk's attention over the context. Unlike KVzip, which normalises a chunk's
attention over that chunk's own slice of the context, every read-out query here scores every span entry with its
softmax over everything it sees, so a span read in one chunk gets KVzip's scores unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.errors import VkvError
from vkv.kv.segment import Segment
from vkv.lm.capture import projection_hooks
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM
from vkv.progress import counted
from vkv.settings import setting
from vkv.stages import stage

REPEAT_REQUEST = "\n\nRepeat the previous context exactly.\n\n"
TEMPLATE_REQUEST = "\n\nRepeat the previous context exactly."  # closed by the chat template's assistant header
REPEAT_PART_REQUEST = "\n\nRepeat the part of the previous context exactly, starting with"
QUOTED_TOKENS = 8  # the previous chunk's last tokens that the request for the next chunk quotes (KVzip's count)
MIN_CHUNK = 64  # a read-out shorter than this spends more tokens on its request than on the span
DEFAULT_CHUNK = 2048  # KVzip's chunk length
SINKS = 4  # KVzip's attention sinks: the sequence's first entries, in every chunk's softmax
NORMALISATIONS = ("context", "chunk")
SCORE_ELEMENTS = 2**26  # read-out scores held at once (query heads × queries × entries): 256 MiB in float32


def chunk_setting():
    """The read-out's chunk length, declared once for every method that runs the pass."""
    return setting(
        DEFAULT_CHUNK,
        "the reconstruction pass reads the span out in chunks of at most this many tokens, each after the whole "
        "span; where the model's positions leave less room after the span, chunks are shorter",
        minimum=MIN_CHUNK,
    )


def normalisation_setting():
    """How the pass's scores are normalised, declared once (kvzip's option)."""
    return setting(
        "context",
        "the softmax that scores entries in the reconstruction pass: context, over every entry a read-out query "
        "sees (the model's own attention, one request closing the span); chunk, as KVzip's reference code does: over "
        "the sequence's first 4 entries, the chunk's own slice of the span and the read-out, the request's queries "
        "counted and the request closed by the chat template's assistant header",
        NORMALISATIONS,
    )


@dataclass
class ReconstructionPass:
    """The read-out of a span after the context it is compressed in (the verbatim conversation, or per turn the
    running compressed cache) and the repeat request, chunk after chunk."""

    queries: torch.Tensor  # [layers, heads, n, head_dim] pre-RoPE queries of the repeated span tokens
    positions: torch.Tensor  # [n] their logical positions
    scores: torch.Tensor | None  # [layers, kv_heads, n] KVzip's importance of each span entry (when asked for)

    @classmethod
    def run(cls, work, chunk: int, score: bool = False, normalise: str = "context") -> ReconstructionPass:
        """The pass for a method's work: its span after `work.prefix_cache()`, with the span's entries
        (`work.span_entries()`: its own K/V, or a running cache's compacted history)."""
        span = work.ids[work.start : work.end]
        return cls.run_on(work.lm, span, work.prefix_cache(), work.span_entries(), chunk, score, normalise)

    @classmethod
    def run_on(
        cls,
        lm: FrozenLM,
        span: list[int],
        context_cache,
        entries: Segment,
        chunk: int,
        score: bool = False,
        normalise: str = "context",
    ) -> ReconstructionPass:
        """Feed each chunk's request and the chunk on top of `context_cache` (a SplicedCache of everything before the
        span, extended here) and the span's `entries` (a segment standing for the span's tokens `span`: its own K/V,
        or entries already compacted, whose scores are then per slot); record the read-out's queries and, with
        `score`, each slot's largest attention from any of them (`normalise`: NORMALISATIONS, see
        `normalisation_setting`; chunk only where each slot is the span token of its index)."""
        span = list(span)
        if normalise == "chunk" and (entries.kind != "verbatim" or entries.slots != len(span)):
            raise VkvError("the chunk normalisation scores a span's own tokens, not entries already compacted")
        feeds = read_out_feeds(lm, span, context_cache.next_position, chunk, template=normalise == "chunk")
        context_cache.append(entries)
        # the span's entries must be the last dense ones: compacted ones (padded per head) are kept dense too
        context = Context(lm, context_cache, padded=entries.kind != "verbatim")
        queries, positions, scores, lo = [], [], None, 0
        label = f"read-out of {len(span)} tokens" + (", scored" if score else "")
        with counted(label, len(feeds)) as done:
            for fed, first in feeds:
                piece = len(fed) - first  # the span's tokens [lo, lo + piece) are fed from row `first` on
                at = torch.arange(len(fed)).float() + context.position
                with stage("read-out", lm.device), projection_hooks(lm, 0, len(fed), queries=True) as store:
                    context.feed(fed)
                q = torch.stack(store["queries_pre_rope"])  # [layers, heads, fed, head_dim]
                if score:
                    with stage("scoring", lm.device):
                        if normalise == "chunk":
                            s = chunk_scores(
                                lm, context, q, at, torch.arange(len(fed)), entries.slots, own=(lo, lo + piece)
                            )
                        else:
                            rows = torch.arange(first, len(fed))
                            s = chunk_scores(lm, context, q[:, :, first:], at[first:], rows, entries.slots)
                    scores = s if scores is None else torch.maximum(scores, s)
                queries.append(q[:, :, first:])
                positions.append(at[first:])
                context.rewind(0)
                lo += piece
                done()
        return cls(torch.cat(queries, dim=2), torch.cat(positions), scores)


def reconstruction_pass(work, chunk: int = DEFAULT_CHUNK, score: bool = True) -> ReconstructionPass:
    """The work's read-out, with its scores (normalised over the context) where `score`, run once per work and chunk:
    kvzip's and vkv's scores and am's and kvopt's reference queries all come from it. A caller that needs only the
    queries takes a scored pass already run, and otherwise runs one without scores (the scoring is about as long
    as the read-out itself); a later caller that needs scores then runs the pass again."""
    scored = ("reconstruction pass", chunk)
    if score or work.has(scored):
        return work.reuse(scored, lambda: ReconstructionPass.run(work, chunk, score=True))
    return work.reuse(("reconstruction pass, unscored", chunk), lambda: ReconstructionPass.run(work, chunk))


def reconstruction_scores(work, chunk: int = DEFAULT_CHUNK, normalise: str = "context") -> torch.Tensor:
    """KVzip's importance of each of the work's span entries `[layers, kv_heads, n]`, computed once per work, chunk
    and normalisation (runs at several ratios, and every method that ranks by it, share the pass)."""
    if normalise == "context":
        return reconstruction_pass(work, chunk).scores
    return work.reuse(
        ("reconstruction scores", chunk, normalise),
        lambda: ReconstructionPass.run(work, chunk, score=True, normalise=normalise).scores,
    )


def read_out_chunk(lm: FrozenLM, after: int, span: int, request: int, later_request: int, chunk: int) -> int:
    """The chunk length the pass uses: the whole span when it fits in one chunk, else at most `chunk` and short
    enough that a chunk and its request fit in the model's positions after the span (which starts at position
    `after`); refuses, before any pass, a span that leaves room for less than MIN_CHUNK tokens, saying which fit."""
    limit = lm.max_positions or after + 2 * span + max(request, later_request)
    if span <= min(chunk, limit - after - span - request):
        return span
    size = min(chunk, limit - after - span - max(request, later_request))
    if size < MIN_CHUNK:
        need = after + span + max(request, later_request) + MIN_CHUNK
        lm.check_positions(
            need,
            f"the reconstruction pass (kvzip's scores, am's reconstruction queries) reads the span's {span} tokens "
            f"out again after it, in chunks of at least {MIN_CHUNK}",
            f"spans of up to {max(0, span - (need - limit))} tokens fit after this context; compress this one in "
            "turns (--per-turn) or in shorter windows",
        )
    return size


def chunk_scores(
    lm: FrozenLM,
    context: Context,
    queries: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor,
    span: int,
    own: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The largest attention each of the span's entries `[layers, kv_heads, span]` (the last `span` entries the
    context was built with) receives from one chunk's read-out queries (`[layers, heads, c, head_dim]` pre-RoPE at
    `positions`, at fed rows `rows`), over any query head sharing its KV head (softmax over every entry that query
    sees, the context's entry biases included). With `own` = the chunk's slice [lo, hi) of the span, KVzip's
    reference normalisation: the softmax covers only the context's first SINKS entries, that slice and the fed
    rows, and only that slice is scored (the rest of the span gets 0)."""
    group = lm.spec.num_heads // lm.spec.num_kv_heads
    out = []
    for layer, cache_layer in enumerate(context.cache.layers):
        keys, _, bias = cache_layer.materialize()
        built = cache_layer.slots + cache_layer.loaded  # where the fed rows start among the materialised ones
        k = keys[0].float().repeat_interleave(group, dim=0)  # [H, N, D]
        entry_bias = bias[0].to(k.device).float().repeat_interleave(group, dim=0)[:, None]  # [H, 1, N]
        column = torch.arange(k.shape[1], device=k.device)
        kept = None
        if own is not None:
            lo, hi = built - span + own[0], built - span + own[1]
            kept = (column < min(SINKS, built - span + own[0])) | ((column >= lo) & (column < hi)) | (column >= built)
        best = torch.zeros(k.shape[0], span, device=k.device)
        step = max(1, SCORE_ELEMENTS // (k.shape[0] * k.shape[1]))  # the queries whose scores are held at once
        for first in range(0, queries.shape[2], step):
            part = slice(first, first + step)
            q = lm.rotate(queries[layer][:, part].to(lm.device).float(), positions[part])  # [H, c, D]
            scores = q @ k.transpose(1, 2) * lm.spec.head_dim**-0.5 + entry_bias
            visible = column[None, :] <= (rows[part].to(k.device) + built)[:, None]
            if kept is not None:
                visible &= kept[None, :]
            probs = scores.masked_fill_(~visible, float("-inf")).softmax(-1)[:, :, built - span : built]
            best = torch.maximum(best, probs.amax(1))
        if own is not None:
            best = best * ((column[:span] >= own[0]) & (column[:span] < own[1]))
        out.append(best.reshape(lm.spec.num_kv_heads, group, -1).amax(1))
    return torch.stack(out).cpu()


def read_out_feeds(
    lm: FrozenLM, span: list[int], start: int, chunk: int, template: bool = False
) -> list[tuple[list[int], int]]:
    """The token sequences `ReconstructionPass.run_on` feeds after a span of tokens `span` that starts at position
    `start` (each fed from position start + len(span) on), with where its piece of the span starts among them. With
    `template`, each request is closed by the chat template's assistant header, as KVzip's reference code does."""
    encode = lm.tokenizer.encode
    suffix = encode(assistant_header(lm.tokenizer), add_special_tokens=False) if template else []
    request = encode(TEMPLATE_REQUEST if template else REPEAT_REQUEST, add_special_tokens=False) + suffix
    part = encode(REPEAT_PART_REQUEST, add_special_tokens=False)
    size = read_out_chunk(lm, start, len(span), len(request), len(part) + QUOTED_TOKENS + len(suffix), chunk)
    feeds = []
    for lo in range(0, len(span), size):
        piece = span[lo : lo + size]
        fed = (request if lo == 0 else part + span[max(0, lo - QUOTED_TOKENS) : lo] + suffix) + piece
        feeds.append((fed, len(fed) - len(piece)))
    return feeds


def assistant_header(tokenizer) -> str:
    """What the chat template puts between a user message's content and the assistant's answer ("\n" without a
    template): how KVzip's reference closes its repeat request."""
    if not getattr(tokenizer, "chat_template", None):
        return "\n"
    marker = "\n" + "#" * 13
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "dummy context" + marker}], add_generation_prompt=True, tokenize=False
    )
    return text.split(marker, 1)[1]
