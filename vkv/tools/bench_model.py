"""The one model a benchmark loads, shared by `vkv bench optimizer`, `cache` and `scaling`."""

from __future__ import annotations

from dataclasses import dataclass

from vkv.lm.frozen import FrozenLM
from vkv.lm.load import load_model
from vkv.settings import setting


@dataclass
class BenchModel:
    """The one model a benchmark loads (nested in its config: the flags stay `--model`, `--quant`, `--device`)."""

    model: str = setting("smollm2-135m", "alias, directory or hub id")
    quant: str = setting("fp32", "quantisation of the model")
    device: str = setting("cpu", "cpu, cuda, cuda:N or auto")

    def load(self) -> FrozenLM:
        return load_model(self.model, quant=self.quant, device=self.device)
