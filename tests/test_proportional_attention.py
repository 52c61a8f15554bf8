"""Proportional attention: a virtual token standing for s tokens gets log(s) added to later queries' logits."""

import torch

from tests.conftest import FIXTURES
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.single import compress_span
from vkv.kv.context import Context
from vkv.kv.file import load_cache, save_cache
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.capture import capture_span
from vkv.text.transcript import load_transcript, render


def _rendered(lm):
    return render(load_transcript(FIXTURES / "mini-agent.json"), lm.tokenizer)


def test_mass_of_one_changes_nothing_and_duplicated_entries_equal_mass_two(tiny_llama):
    ids = _rendered(tiny_llama).ids[:40]
    _, cache = capture_span(tiny_llama, ids, 0, 30, keep_cache=True)
    prefix = KVPrefix.from_cache(cache)
    plain = SplicedCache()
    plain.append(verbatim_segment(prefix.slice(0, 30), 0))
    ones = SplicedCache()
    ones.append(verbatim_segment(prefix.slice(0, 30), 0))
    ones.segments[0].mass = torch.ones(30)
    probe = ids[30:40]
    torch.testing.assert_close(Context(tiny_llama, plain).feed(probe), Context(tiny_llama, ones).feed(probe))

    # an entry repeated twice attracts exactly the attention of one entry with mass 2
    seg = verbatim_segment(prefix.slice(0, 30), 0)
    twice = SplicedCache()
    doubled = torch.cat([torch.arange(30), torch.tensor([29])])
    twice.append(
        Segment("verbatim", (0, 30), seg.keys[:, :, doubled], seg.values[:, :, doubled], seg.positions[doubled])
    )
    weighted = SplicedCache()
    weighted.append(
        Segment(
            "verbatim",
            (0, 30),
            seg.keys,
            seg.values,
            seg.positions,
            mass=torch.cat([torch.ones(29), torch.tensor([2.0])]),
        )
    )
    torch.testing.assert_close(
        Context(tiny_llama, twice).feed(probe), Context(tiny_llama, weighted).feed(probe), atol=1e-5, rtol=1e-4
    )


def test_virtual_segment_mass_counts_its_blocks_and_survives_a_file(tiny_llama, tmp_path):
    rendered = _rendered(tiny_llama)
    start, end = rendered.spans[1].start, rendered.spans[3].start
    config = CompressConfig(ratio=3.0, proportional_attention=True, optim=OptimConfig(steps=1))
    spliced = compress_span(tiny_llama, rendered.ids, start, end, config)
    virtual = spliced.segments[1]
    assert (
        virtual.mass is not None and int(virtual.mass.sum()) == end - start and virtual.mass.numel() == virtual.entries
    )
    spliced.meta.update({"fingerprint": tiny_llama.fingerprint, "spec": tiny_llama.spec.to_dict()})
    save_cache(spliced, tmp_path / "c.safetensors")
    loaded = load_cache(tmp_path / "c.safetensors")
    torch.testing.assert_close(loaded.attention_bias(), spliced.attention_bias())
    assert spliced.attention_bias()[:start].abs().max() == 0
    off = compress_span(
        tiny_llama,
        rendered.ids,
        start,
        end,
        CompressConfig(ratio=3.0, proportional_attention=False, optim=OptimConfig(steps=1)),
    )
    assert off.segments[1].mass is None and off.attention_bias() is None
