"""`model.generate()` continuing a spliced cache: any decoding transformers offers (greedy, sampling, beams,
stopping criteria, streamers) on a compressed conversation.

The cache becomes a RaggedCache, which owns its logical position and its entries' biases, so `generate()` runs as it
does on any cache, given `RaggedCache.generate_inputs(prompt)`.
"""

from __future__ import annotations

from typing import Any

import torch

from vkv.errors import VkvError
from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM


def generate(lm: FrozenLM, spliced: SplicedCache, prompt: list[int] | torch.Tensor, **generate_kwargs: Any):
    """`lm.model.generate(**generate_kwargs)` after the spliced cache and then `prompt` (token ids); returns the
    new tokens `[num_return_sequences, new]` (with `return_dict_in_generate=True`, the output object, whose
    `sequences` hold the new tokens only). Stops at the model's end-of-turn tokens unless told otherwise."""
    fingerprint = spliced.meta.get("fingerprint")
    if fingerprint is not None and fingerprint != lm.fingerprint:
        raise VkvError(
            f"field fingerprint: the cache was built for model '{spliced.meta.get('model')}' ({fingerprint}), "
            f"not for '{lm.name}' ({lm.fingerprint})"
        )
    prompt = torch.as_tensor(prompt, dtype=torch.long).reshape(1, -1)
    if prompt.shape[1] == 0:
        raise VkvError("generate needs at least one prompt token after the cache")
    lm.check_prefill(prompt.shape[1], prompt.shape[1], f"a prompt of {prompt.shape[1]} tokens")
    cache = lm.ragged_cache(spliced)
    inputs = cache.generate_inputs(prompt)
    input_ids = inputs["input_ids"]
    generate_kwargs.setdefault("eos_token_id", sorted(lm.stop_token_ids()))
    generate_kwargs.setdefault("pad_token_id", lm.tokenizer.pad_token_id or sorted(lm.stop_token_ids())[0])
    with torch.no_grad():
        out = lm.model.generate(**inputs, **lm.with_cache(cache), **generate_kwargs)
    if hasattr(out, "sequences"):
        out.sequences = out.sequences[:, input_ids.shape[1] :]
        return out
    return out[:, input_ids.shape[1] :]
