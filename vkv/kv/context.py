"""Ask questions against a SplicedCache: greedy answers and log-probabilities of given continuations.

New tokens always get explicit logical positions (continuing at the cache's next_position) and an explicit
mask; after each question the cache is cropped back, so many questions share one compressed context.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM


class Context:
    """A (compressed or full) context that questions are run against without changing it."""

    def __init__(self, lm: FrozenLM, spliced: SplicedCache):
        self.lm = lm
        self.cache = spliced.to_dynamic_cache(lm)
        bias = spliced.attention_bias()  # [layers, kv_heads, base_length]: every new query adds it
        self.bias = None if bias is None else [b[None].to(lm.device) for b in bias]
        self.base_length = spliced.physical_length
        self.base_position = spliced.next_position
        self.length = self.base_length
        self.position = self.base_position

    def feed(self, ids: list[int]) -> torch.Tensor:
        """Append tokens; returns float32 logits `[len(ids), vocab]` (row i predicts the token after ids[i])."""
        if not ids:
            return torch.empty(0, self.lm.spec.vocab_size)
        n = len(ids)
        positions = torch.arange(self.position, self.position + n, dtype=torch.float32, device=self.lm.device)
        with torch.no_grad(), self.lm.entry_bias(self.bias):
            out = self.lm.model(
                input_ids=torch.tensor([ids], device=self.lm.device),
                position_ids=positions[None],
                attention_mask=self._mask(n),
                past_key_values=self.cache,
                use_cache=True,
            )
        self.length += n
        self.position += n
        return out.logits[0].float()

    def _mask(self, n: int) -> torch.Tensor:
        return self.lm.causal_mask(self.length, n)

    def rewind(self, length: int, position: int) -> None:
        self.lm.crop_cache(self.cache, length)
        self.length, self.position = length, position

    @contextmanager
    def scratch(self) -> Iterator[Context]:
        """Everything fed inside the block is removed afterwards."""
        length, position = self.length, self.position
        try:
            yield self
        finally:
            self.rewind(length, position)

    def continuation_logprobs(self, prompt: list[int], continuations: list[list[int]]) -> list[torch.Tensor]:
        """Per-token log p of each continuation after the prompt `[len(continuation)]` each."""
        results = []
        with self.scratch():
            first = torch.log_softmax(self.feed(prompt)[-1], -1)
            for cont in continuations:
                with self.scratch():
                    rest = torch.log_softmax(self.feed(cont[:-1]), -1) if len(cont) > 1 else first[None][:0]
                    dists = torch.cat([first[None], rest])
                    results.append(dists.gather(-1, torch.tensor(cont)[:, None].to(dists.device))[:, 0].cpu())
        return results

    def greedy(self, prompt: list[int], max_new_tokens: int = 24) -> list[int]:
        stops = self.lm.stop_token_ids()
        generated: list[int] = []
        with self.scratch():
            logits = self.feed(prompt)[-1]
            for _ in range(max_new_tokens):
                token = int(logits.argmax())
                if token in stops:
                    break
                generated.append(token)
                logits = self.feed([token])[-1]
        return generated

    def next_token_logprobs(self, prompt: list[int]) -> torch.Tensor:
        """Log-distributions `[len(prompt), vocab]` after each prompt token (for fidelity KL)."""
        with self.scratch():
            return torch.log_softmax(self.feed(prompt), -1).cpu()
