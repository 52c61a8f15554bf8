"""`model.generate()` continuing a spliced cache: any decoding transformers offers (greedy, sampling, beams,
stopping criteria, streamers) on a compressed conversation.

The cache's K/V become a DynamicCache; new tokens sit at the cache's logical positions (a compressed span holds
fewer entries than the positions it covers) and every entry's attention bias is added at every step, both by
hooks on the model (`FrozenLM.position_offset`, `FrozenLM.entry_bias`) that are removed when generation ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vkv.errors import VkvError
from vkv.kv.spliced import SplicedCache

if TYPE_CHECKING:
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
    physical = spliced.physical_length
    # generate() takes the ids of everything cached, then slices off what the cache holds; these are never fed
    input_ids = torch.cat([torch.zeros(1, physical, dtype=torch.long), prompt], dim=1).to(lm.device)
    bias = spliced.attention_bias()
    generate_kwargs.setdefault("eos_token_id", sorted(lm.stop_token_ids()))
    generate_kwargs.setdefault("pad_token_id", lm.tokenizer.pad_token_id or sorted(lm.stop_token_ids())[0])
    with (
        torch.no_grad(),
        lm.position_offset(spliced.next_position - physical),
        lm.entry_bias(None if bias is None else [b[None] for b in bias]),
    ):
        out = lm.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            **lm.with_cache(spliced.to_dynamic_cache(lm)),
            **generate_kwargs,
        )
    if hasattr(out, "sequences"):
        out.sequences = out.sequences[:, input_ids.shape[1] :]
        return out
    return out[:, input_ids.shape[1] :]
