"""The method on the real test model (fp32 and 8-bit): few steps, small spans."""

import pytest
import torch

from vkv.cli import main
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.span import compress_transcript
from vkv.lm.context import Context
from vkv.text.transcript import load_transcript

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("quant", ["fp32", "8bit"])
def test_optimisation_halves_the_v_loss_on_a_real_span(quant, smol, smol8, mini_transcript_path):
    lm = smol if quant == "fp32" else smol8
    transcript = load_transcript(mini_transcript_path)
    config = CompressConfig(verbatim_share=0.0, optim=OptimConfig(steps=25, lr=1e-2, patience=25))  # tokens alone
    spliced = compress_transcript(lm, transcript, (3, 5), 3.2, config)  # the package.json output and the reply
    virtual = [s for s in spliced.segments if s.kind == "virtual"][0]
    assert virtual.real_entries == round(virtual.original_tokens / 3.2)  # what heads reach; twice that optimised
    assert virtual.stats["best_loss"] <= 0.5 * virtual.stats["initial_loss"], virtual.stats
    kinds = [s.kind for s in spliced.segments]
    assert kinds == ["verbatim", "virtual", "verbatim"]
    assert spliced.next_position == spliced.meta["transcript"]["tokens"]


def test_all_verbatim_identity_on_test_model(smol, mini_transcript_path):
    from vkv.kv.prefix import KVPrefix
    from vkv.kv.segment import verbatim_segment
    from vkv.kv.spliced import SplicedCache
    from vkv.lm.capture import capture_span
    from vkv.text.transcript import render

    rendered = render(load_transcript(mini_transcript_path), smol.tokenizer)
    ids, cut = rendered.ids, rendered.spans[5].start
    _, cache = capture_span(smol, ids, 0, cut, keep_cache=True)
    spliced = SplicedCache()
    for span in rendered.spans[:5]:
        spliced.append(verbatim_segment(KVPrefix.from_cache(cache).slice(span.start, span.end), span.start))
    logits = Context(smol, spliced).feed(ids[cut:])
    with torch.no_grad():
        reference = smol.model(input_ids=torch.tensor([ids])).logits[0, cut:].float()
    assert (logits - reference).abs().max().item() <= 1e-4


@pytest.mark.parametrize("quant", ["fp32", "8bit"])
def test_compress_inspect_ask_from_the_cli(quant, mini_transcript_path, tmp_path, capsys, test_model_dir):
    out = tmp_path / "c.safetensors"
    assert (
        main(
            [
                "compress",
                str(mini_transcript_path),
                "--method",
                "vkv",
                "--model",
                "smollm2-135m",
                "--quant",
                quant,
                "--ratio",
                "3.2",
                "--span",
                "turns:3-4",
                "--steps",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert main(["inspect", str(out)]) == 0
    assert "compact" in capsys.readouterr().out  # the default recipe: each head holds what it reaches
    assert (
        main(
            ["ask", str(out), "--quant", quant, "--question", "Which hashing library is used?", "--max-new-tokens", "4"]
        )
        == 0
    )
    assert "A:" in capsys.readouterr().out
