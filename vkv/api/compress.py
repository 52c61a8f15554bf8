"""`vkv.compress`: a conversation compressed by any KV method into a cache a plain transformers model decodes on.

    cache = vkv.compress(model, tokenizer, messages, method="kvzip", ratio=8.0)
    ids = tokenizer.apply_chat_template(messages + [question], add_generation_prompt=True, return_tensors="pt")
    out = model.generate(ids, past_key_values=cache, max_new_tokens=64)   # `cache=cache` from transformers 5.24

The work is the eval's, step for step (`SpanWork.capture`, `vkv.lm.splice.splice`), so a cache built here
scores exactly as `vkv eval` scores the method. The cache is a RaggedCache: it holds the compressed entries only and
reports the conversation's logical length (`get_seq_length()`), so new tokens take the positions the original ones
would; `generate()`, given the whole conversation's ids as transformers expects when it continues a cache, feeds only
the ids after that length and never reads the covered ones. `copy.deepcopy(cache)` is an independent copy, for asking
several questions of one compressed conversation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from vkv import upgrade
from vkv.api.session import is_turn_range
from vkv.compress.budget import DEFAULT_METHOD, span_budget
from vkv.compress.recipe import VkvRecipe
from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.kv.file import cache_metadata, transcript_record
from vkv.kv.ragged import RaggedCache
from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM
from vkv.lm.splice import splice
from vkv.methods import METHODS, get_method
from vkv.methods.base import Method, TextMethod
from vkv.text.formats import load_conversation
from vkv.text.transcript import Transcript, render

QUANTS_BY_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def compress(
    model,
    tokenizer,
    messages: Transcript | Sequence[Mapping[str, Any]] | str | Path,
    method: str = DEFAULT_METHOD,
    ratio: float = 8.0,
    turns: tuple[int, int] | None = None,
    seed: int = 0,
    **options: Any,
) -> RaggedCache:
    """Compress messages [first, last) of a conversation (`turns`; default every message after the leading system
    message, as `vkv eval`) by `method` at `ratio` span tokens per entry, the rest kept verbatim, on `model` (a
    transformers causal LM, loaded with attn_implementation 'sdpa' or 'eager'). `messages`: the conversation in any
    format `vkv.load_conversation` reads (a file's path, OpenAI or Anthropic messages, vkv's role/content dicts with
    optional `tool_calls` and `name`, or a Transcript); `method`: Attention Matching ('am') unless named; `options`: the method's own (its
    dataclass fields, e.g. `head_budget="global"`, `per_turn=True` to compress each message on its own on the
    running cache, as `--per-turn`; vkv's `recipe=VkvRecipe(...)` or its virtual tokens' `CompressConfig(...)`). Returns the decoding cache on the model's device and
    in its dtype, of `get_seq_length()` = the conversation's rendered length.

    The model is switched to vkv's attention (`use_ragged_attention`: unchanged on any other cache), put in eval
    mode with its parameters frozen; the global torch seed is set to `seed` first, as the eval does."""
    if turns is not None and not is_turn_range(turns):
        raise VkvError(f"field turns: expected (first, last), two message indices, got {turns!r}")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise VkvError(f"field ratio: expected a number above 1 (span tokens per entry), got {ratio!r}")
    chosen = _kv_method(method, options)
    transcript = load_conversation(messages)
    lm = frozen(model, tokenizer)
    return lm.ragged_cache(compress_with(lm, transcript, turns or transcript.default_span(), chosen, ratio, seed))


def compress_with(
    lm: FrozenLM,
    transcript: Transcript,
    turns: tuple[int, int],
    method: Method,
    ratio: float,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> SplicedCache:
    """Messages [turns[0], turns[1]) of `transcript` compressed by a registered KV method, as `vkv eval` does it
    (SpanWork.capture, then Method.compress with the torch seed set, then splice): the spliced cache of the whole
    rendering, with the metadata a cache file records (model, transcript, method, its config and the ratio)."""
    if isinstance(method, TextMethod) or method.question_aware:
        raise VkvError(
            f"method '{method.name}' "
            + ("prunes text, so it has no cache" if isinstance(method, TextMethod) else "needs the questions")
            + "; it is scored by `vkv eval` only"
        )
    rendered = render(transcript, lm.tokenizer, max_tokens=lm.max_positions)
    lm.check_positions(len(rendered.ids), f"the conversation ({len(rendered.ids)} tokens)", "compress fewer messages")
    first, last = turns
    if not 0 <= first < last <= len(transcript.messages):
        raise VkvError(
            f"field turns: ({first}, {last}) is not a non-empty range of the {len(transcript.messages)} messages"
        )
    start, end = rendered.token_span(first, last)
    if method.uses_ratio and not method.chooses_ratio:
        span_budget(end - start, ratio)  # refused before the prefill
    work = SpanWork.capture(lm, rendered.ids, start, end, rendered.message_starts, rendered.message_roles, seed)
    torch.manual_seed(seed)
    segment = method.compress(work, ratio if method.uses_ratio else 1.0, on_step)
    spliced = splice(lm, work.kv, start, end, segment, rendered.ids[end:])
    spliced.meta = cache_metadata(
        lm,
        transcript=transcript_record(transcript, (first, last), len(rendered.ids)),
        method=method.name,
        config=method.config(),
        ratio=ratio if method.uses_ratio and not method.chooses_ratio else None,
        seed=seed,
    )
    return spliced


def frozen(model, tokenizer) -> FrozenLM:
    """vkv's view of a loaded transformers model (no copy): its precision read from how it was loaded."""
    if getattr(model, "is_loaded_in_8bit", False):
        quant = "8bit"
    elif getattr(model, "is_loaded_in_4bit", False):
        quant = "4bit"
    else:
        quant = QUANTS_BY_DTYPE.get(model.dtype, str(model.dtype).replace("torch.", ""))
    name = getattr(model.config, "name_or_path", "") or type(model).__name__
    return FrozenLM(model, tokenizer, name=name, quant=quant, device=model.device)


def _kv_method(name: str, options: dict[str, Any]):
    """The registered KV method `name` with `options`, refusing text methods, vkv's earlier mode methods and switches
    (naming today's options) and options it does not have."""
    renamed = upgrade.renamed_method(name)
    if renamed:
        raise VkvError(renamed)
    supported = ", ".join(n for n, c in METHODS.items() if not issubclass(c, TextMethod))
    if name not in METHODS:
        raise VkvError(f"unknown method '{name}'; vkv.compress supports {supported}")
    cls = METHODS[name]
    if issubclass(cls, TextMethod):
        raise VkvError(
            f"method '{name}' prunes the messages' text, not the KV cache, so it has no cache to return; prune "
            f"with `vkv prune` and prefill the shorter text, or use one of {supported}"
        )
    if "keep_verbatim" in options and cls.recipe_class is VkvRecipe:
        raise VkvError(
            "field keep_verbatim was renamed: vkv keeping a share of the span's tokens verbatim for every head is "
            'recipe=vkv.VkvRecipe(verbatim="shared")'
        )
    unknown = sorted(set(options) - set(cls.option_names()))
    if unknown:
        raise VkvError(
            f"method '{name}' has no option {', '.join(unknown)}; its options are "
            f"{', '.join(cls.option_names()) or 'none'}"
        )
    return get_method(name, **options)
