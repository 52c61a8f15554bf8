"""Loss-aware ratios: the ladder search, and the tolerance re-measured on the compressed turns (tiny model)."""

import pytest
import torch

from vkv.api.session import Session
from vkv.compress.autoratio import AutoRatioConfig, choose_ratio, segment_loss
from vkv.compress.blocks import span_blocks
from vkv.compress.budget import entries_at
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.pooling import block_weights
from vkv.compress.recipe import VkvRecipe
from vkv.compress.sequential import FullHistory
from vkv.compress.targets import build_targets
from vkv.errors import VkvError
from vkv.kv.segment import Segment
from vkv.methods import get_method
from vkv.text.transcript import load_transcript

LADDER = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def fake_segment(kind: str, loss: float, entries: int) -> Segment:
    empty = torch.zeros(1, 1, entries, 1)
    return Segment(kind, (0, 96), empty, empty, torch.arange(entries).float(), stats={"per_layer_loss": [loss, loss]})


@pytest.mark.parametrize("threshold", [0.05, 0.25, 0.45, 0.9, 5.0])
def test_ladder_search_returns_the_highest_ratio_within_tolerance(threshold):
    loss_of = {entries_at(96, r): 0.1 * i for i, r in enumerate(LADDER, start=1)}  # grows with the ratio
    built = []

    def build(entries):
        built.append(entries)
        return fake_segment("virtual", loss_of[entries], entries)

    segment = choose_ratio(96, build, lambda: fake_segment("verbatim", 0.0, 96), AutoRatioConfig(threshold, LADDER))
    passing = [r for r in LADDER if loss_of[entries_at(96, r)] <= threshold]
    chosen = segment.stats["auto_ratio"]["chosen"]
    assert chosen == (max(passing) if passing else 1.0)
    assert segment_loss(segment) <= threshold
    assert len(built) <= 3  # bisection over six rungs
    for ratio, loss in segment.stats["auto_ratio"]["tried"].items():
        assert (loss <= threshold) == (float(ratio) <= chosen)


def test_auto_ratio_never_exceeds_its_tolerance_on_the_turn_it_measured(tiny_llama):
    from tests.conftest import FIXTURES

    transcript = load_transcript(FIXTURES / "mini-agent.json")
    max_loss = 0.12
    config = VkvRecipe(
        CompressConfig(optim=OptimConfig(steps=3)), auto_ratio=True, tolerance=AutoRatioConfig(max_loss, LADDER)
    )
    session = Session(tiny_llama, get_method("vkv", recipe=config))
    session.extend(list(transcript.messages[:5]))
    session.compress(turns=(1, 5))
    history = FullHistory.capture(tiny_llama, session.ids, session.turns[1].start, session.turns[4].end)
    chosen = []
    for turn, segment in zip(session.turns[1:5], session.cache.segments[1:5]):
        chosen.append(segment.stats["auto_ratio"]["chosen"])
        if segment.kind == "verbatim":
            continue
        acts = history.view(turn).acts  # re-measure: the stored V against freshly built oracle targets
        blocks = span_blocks(
            tiny_llama, session.ids, turn.start, turn.end, segment.slots, config.compress, acts.surprisal
        )
        weights = block_weights("surprisal", blocks, acts.surprisal)
        targets = build_targets(tiny_llama, torch.tensor(session.ids), acts, blocks, weights, "v")
        per_layer = (segment.values - targets.values).pow(2).mean(dim=(1, 2, 3)) / targets.value_scale
        assert float(per_layer.mean()) <= max_loss + 1e-6
        assert float(per_layer.mean()) == pytest.approx(segment.stats["loss"], abs=1e-5)
    assert len(set(chosen)) > 1 or chosen[0] != LADDER[-1]  # the tolerance actually bit on this conversation


def test_auto_ratio_settings_are_checked():
    with pytest.raises(VkvError, match="field max_loss: must be a positive number"):
        AutoRatioConfig(0.0).validate()
    with pytest.raises(VkvError, match="field max_loss: auto-ratio needs a tolerance"):
        AutoRatioConfig().validate()
    with pytest.raises(VkvError, match="ladder"):
        AutoRatioConfig(0.3, (0.5, 2.0)).validate()
    assert AutoRatioConfig(0.3, (4, 2, 2)).validate().ladder == (2.0, 4.0)
