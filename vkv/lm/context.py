"""Ask questions against a SplicedCache: greedy answers and log-probabilities of given continuations.

The context holds the cache as a RaggedCache on the model's device: compressed entries take the memory they use,
new tokens continue at the cache's logical position, and every entry's bias is applied by the attention function.
After each question the cache is cropped back, so many questions share one compressed context.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM


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
        n = len(ids)
        self.lm.check_positions(self.position + n, f"{n} tokens fed after position {self.position}")
        if n > 1:  # a decoding step adds one token; its memory is not worth a query of the device's every time
            self.lm.check_prefill(n, n, f"{n} tokens fed after position {self.position}")
        positions = torch.arange(self.position, self.position + n, dtype=torch.float32, device=self.lm.device)
        with torch.no_grad():
            out = self.lm.model(
                input_ids=torch.tensor([ids], device=self.lm.device),
                position_ids=positions[None],
                **self.lm.with_cache(self.cache),
                use_cache=True,
            )
        return out.logits[0].float()

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

    def greedy(self, prompt: list[int], max_new_tokens: int = 24) -> list[int]:
        with self.scratch():
            return self._decode(self.feed(prompt)[-1], max_new_tokens)

    def score(
        self, prompt: list[int], continuations: list[list[int]], max_new_tokens: int
    ) -> tuple[list[torch.Tensor], torch.Tensor, list[int]]:
        """What the eval asks of one question, with the prompt fed once: each continuation's per-token log p, the
        log-distributions `[len(prompt) + len(continuations[0]) - 1, vocab]` after each prompt token and each
        token of the first continuation but its last, and the greedy answer."""
        with self.scratch():
            prompt_logits = self.feed(prompt)
            prompt_logp = torch.log_softmax(prompt_logits, -1).cpu()
            after = self._after(prompt_logp[-1], continuations)
            logprobs = [dists.gather(-1, torch.tensor(c)[:, None])[:, 0] for c, dists in after]
            fidelity = torch.cat([prompt_logp, after[0][1][1:]])
            return logprobs, fidelity, self._decode(prompt_logits[-1], max_new_tokens)

    def _after(self, first: torch.Tensor, continuations: list[list[int]]) -> list[tuple[list[int], torch.Tensor]]:
        """Each continuation with the log-distributions `[len(c), vocab]` before each of its tokens, given `first`,
        the log-distribution after the context fed so far (each continuation is fed in scratch)."""
        out = []
        for cont in continuations:
            with self.scratch():
                rest = torch.log_softmax(self.feed(cont[:-1]), -1).cpu() if len(cont) > 1 else first[None][:0]
            out.append((cont, torch.cat([first[None].cpu(), rest])))
        return out

    def _decode(self, logits: torch.Tensor, max_new_tokens: int) -> list[int]:
        """Greedy tokens from `logits` (the next-token scores after the context fed so far); feeds what it makes."""
        stops = self.lm.stop_token_ids()
        generated: list[int] = []
        for _ in range(max_new_tokens):
            token = int(logits.argmax())
            if token in stops:
                break
            generated.append(token)
            logits = self.feed([token])[-1]
        return generated
