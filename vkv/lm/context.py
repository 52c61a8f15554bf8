"""Ask questions against a SplicedCache: greedy answers and log-probabilities of given continuations.

The context holds the cache as a RaggedCache on the model's device: compressed entries take the memory they use,
new tokens continue at the cache's logical position, and every entry's bias is applied by the attention function.
After each question the cache is cropped back, so many questions share one compressed context.

Many questions are scored side by side, packed into the cache's one sequence of fed tokens: each question's prompt,
each of its continuations and its answer is a stream of tokens that attends to the context, to the streams it
continues and to its own earlier tokens, never to another's, and takes logical positions as if it were alone. So a
forward serves every stream at once with no padding, and every token's keys and values are held once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM

MASKED = float("-inf")


@dataclass
class Streams:
    """Sequences packed side by side into the tokens fed on a context: per stream, which fed tokens it attends to
    (`seen` `[streams, fed]` bool) and the logical position its next token takes (`next` `[streams]`); on the host."""

    seen: torch.Tensor
    next: torch.Tensor

    def select(self, index: list[int]) -> Streams:
        """Streams that continue these (`index`: which one each continues), each on its own from here on."""
        return Streams(self.seen[index], self.next[index])


@dataclass
class Scored:
    """What the eval asks of one question: each continuation's per-token log p, the log-distributions
    `[len(prompt) + len(continuations[0]) - 1, vocab]` after each prompt token and each token of the first
    continuation but its last (on the host), and the greedy answer's ids."""

    logprobs: list[torch.Tensor]
    fidelity: torch.Tensor
    answer: list[int]


class Context:
    """A (compressed or full) context that questions are run against without changing it."""

    def __init__(self, lm: FrozenLM, spliced: SplicedCache, padded: bool = False):
        """`padded=True` keeps every head as long as the longest one (the layout before ragged caches), for
        measuring against."""
        self.lm = lm
        self.cache = lm.ragged_cache(spliced, padded=padded)

    @property
    def length(self) -> int:
        """Tokens fed so far (`cache.fed(start)` gives their K/V)."""
        return self.cache.appended

    @property
    def position(self) -> int:
        """The logical position of the next token."""
        return self.cache.position

    def feed(self, ids: list[int]) -> torch.Tensor:
        """Append tokens; returns float32 logits `[len(ids), vocab]` (row i predicts the token after ids[i])."""
        if not ids:
            return torch.empty(0, self.lm.spec.vocab_size)
        return self.feed_streams(ids, [0] * len(ids), self.streams(1))[0]

    def streams(self, count: int) -> Streams:
        """`count` streams that each continue the context as it stands, seeing every token fed so far."""
        return Streams(torch.ones(count, self.length, dtype=torch.bool), torch.full((count,), self.position))

    def feed_streams(self, ids: list[int], owner: list[int], streams: Streams) -> tuple[torch.Tensor, Streams]:
        """Append `ids`, token i to stream `owner[i]`; returns float32 logits `[len(ids), vocab]` and the streams
        after. Each stream's tokens take consecutive positions from its `next` and attend to what it has seen and
        to its own earlier tokens."""
        owner_t = torch.tensor(owner)
        mine = owner_t[:, None] == torch.arange(len(streams.next))  # [n, streams]: whose each token is
        rank = (mine.cumsum(0) - 1).gather(1, owner_t[:, None])[:, 0]  # its place within its own stream
        positions, after = streams.next[owner_t] + rank, streams.next + mine.sum(0)
        last = int(positions.argmax())
        what = f"{int(rank[last]) + 1} tokens fed after position {int(streams.next[owner[last]])}"
        self.lm.check_positions(int(positions[last]) + 1, what)
        if len(ids) > 1:  # a decoding step adds one token a stream; its memory is not worth the device's query
            self.lm.check_prefill(len(ids), len(ids), what)
        with torch.no_grad():
            out = self.lm.model(
                input_ids=torch.tensor([ids], device=self.lm.device),
                position_ids=positions[None].to(self.lm.device, torch.float32),
                attention_mask=self._mask(owner_t, streams),
                **self.lm.with_cache(self.cache),
                use_cache=True,
            )
        return out.logits[0].float(), Streams(torch.cat([streams.seen, mine.T], 1), after)

    def _mask(self, owner: torch.Tensor, streams: Streams) -> torch.Tensor | None:
        """The additive mask `[1, 1, n, fed + n]` over the tokens fed before and the `n` new ones (token i of stream
        `owner[i]`); None when one stream sees everything fed before (the attention's own causal mask then)."""
        if len(streams.next) == 1 and bool(streams.seen.all()):
            return None
        n = len(owner)
        new = (owner[:, None] == owner[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
        seen = torch.cat([streams.seen[owner], new], dim=1)
        return torch.zeros(seen.shape).masked_fill_(~seen, MASKED)[None, None].to(self.lm.device)

    def rewind(self, length: int) -> None:
        """Drop every token fed after the first `length`."""
        self.cache.crop(length - self.length)

    @contextmanager
    def scratch(self) -> Iterator[Context]:
        """Everything fed inside the block is removed afterwards."""
        length = self.length
        try:
            yield self
        finally:
            self.rewind(length)

    def greedy(self, prompt: list[int], max_new_tokens: int = 24, deadline: float | None = None) -> list[int]:
        """The greedy answer to `prompt`; with `deadline` (a `time.monotonic()` value), what it has made by then."""
        with self.scratch():
            logits = self.feed(prompt)
            return self._decode(logits[-1:], self.streams(1), max_new_tokens, deadline)[0]

    def score(self, questions: Sequence[tuple[list[int], list[list[int]]]], max_new_tokens: int) -> list[Scored]:
        """Each question (prompt, continuations) scored as `score_alone` scores it, all side by side: the prompts in
        one forward, every continuation of every question in another, then the greedy answers a token each per
        forward, an answer leaving when it ends. Memory grows with the tokens fed, not with the context. A question
        without continuations is only answered (its fidelity covers its prompt alone)."""
        prompts = [prompt for prompt, _ in questions]
        owner = [i for i, prompt in enumerate(prompts) for _ in prompt]
        with self.scratch():
            logits, streams = self.feed_streams([t for p in prompts for t in p], owner, self.streams(len(prompts)))
            ends = torch.tensor(list(map(len, prompts))).cumsum(0).tolist()
            last = logits[[end - 1 for end in ends]]
            prompt_logp = [torch.log_softmax(logits[end - len(p) : end], -1).cpu() for p, end in zip(prompts, ends)]
            del logits
            after = self._after_streams([c for _, c in questions], [logp[-1] for logp in prompt_logp], streams)
            answers = self._decode(last, streams, max_new_tokens)
        return [
            _scored(logp, continuations, dists, answer)
            for logp, (_, continuations), dists, answer in zip(prompt_logp, questions, after, answers)
        ]

    def score_alone(self, prompt: list[int], continuations: list[list[int]], max_new_tokens: int) -> Scored:
        """One question, one sequence at a time: the prompt, then each continuation in its own forward, then the
        greedy answer. What `score` computes side by side; kept as the reference it is checked and timed against."""
        with self.scratch():
            logits = self.feed(prompt)
            prompt_logp = torch.log_softmax(logits, -1).cpu()
            dists = self._after(prompt_logp[-1], continuations)
            return _scored(
                prompt_logp, continuations, dists, self._decode(logits[-1:], self.streams(1), max_new_tokens)[0]
            )

    def _after(self, first: torch.Tensor, continuations: list[list[int]]) -> list[torch.Tensor]:
        """Each continuation's log-distributions `[len(c), vocab]` before each of its tokens, given `first`, the
        log-distribution after the context fed so far (each continuation is fed in scratch, alone)."""
        out = []
        for cont in continuations:
            with self.scratch():
                rest = torch.log_softmax(self.feed(cont[:-1]), -1).cpu() if len(cont) > 1 else first[None][:0]
            out.append(torch.cat([first[None].cpu(), rest]))
        return out

    def _after_streams(
        self, continuations: list[list[list[int]]], firsts: list[torch.Tensor], streams: Streams
    ) -> list[list[torch.Tensor]]:
        """`_after` for every question's continuations at once (`firsts[i]`: the log-distribution after stream i):
        one forward of every continuation but its last token, each a stream continuing its question's (in
        scratch)."""
        fed = [(i, j, c[:-1]) for i, cs in enumerate(continuations) for j, c in enumerate(cs) if len(c) > 1]
        out = [[first[None].cpu() for _ in cs] for first, cs in zip(firsts, continuations)]
        if not fed:
            return out
        with self.scratch():
            owner = [k for k, (_, _, cont) in enumerate(fed) for _ in cont]
            ids = [t for _, _, cont in fed for t in cont]
            logits, _ = self.feed_streams(ids, owner, streams.select([i for i, _, _ in fed]))
        start = 0
        for i, j, cont in fed:
            rest = torch.log_softmax(logits[start : start + len(cont)], -1).cpu()
            out[i][j], start = torch.cat([out[i][j], rest]), start + len(cont)
        return out

    def _decode(
        self, logits: torch.Tensor, streams: Streams, max_new_tokens: int, deadline: float | None = None
    ) -> list[list[int]]:
        """Greedy tokens for each stream from `logits` `[streams, vocab]` (the next-token scores after what each has
        fed); feeds what it makes, one token of every stream still answering per forward. A stream stops at a stop
        token or at `max_new_tokens`; every stream stops once `time.monotonic()` passes `deadline`."""
        stops = self.lm.stop_token_ids()
        generated: list[list[int]] = [[] for _ in range(logits.shape[0])]
        active = list(range(logits.shape[0]))  # the streams `logits` holds a row for, in order
        for step in range(max_new_tokens):
            tokens = logits.argmax(-1).tolist()
            going = [(stream, token) for stream, token in zip(active, tokens) if token not in stops]
            for stream, token in going:
                generated[stream].append(token)
            if not going or step == max_new_tokens - 1 or (deadline is not None and time.monotonic() >= deadline):
                break
            active = [stream for stream, _ in going]
            logits, streams = self.feed_streams([token for _, token in going], active, streams)
        return generated


def _scored(
    prompt_logp: torch.Tensor, continuations: list[list[int]], dists: list[torch.Tensor], answer: list[int]
) -> Scored:
    """A question's Scored from its prompt's log-distributions and each continuation's (`dists`, from `_after`)."""
    logprobs = [d.gather(-1, torch.tensor(c, dtype=torch.long)[:, None])[:, 0] for c, d in zip(continuations, dists)]
    return Scored(logprobs, torch.cat([prompt_logp, dists[0][1:]]) if dists else prompt_logp, answer)
