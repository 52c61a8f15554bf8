"""Attention matching's fit of a span (Zweiger et al. 2026): per layer and KV head, some of the span's keys with fitted
biases and refitted values, so that reference queries read the same from the span and give it the same share of
attention, as the paper's reference code runs its headline rows. Method am returns it as it is (methods/am.py); vkv's
recipe with `verbatim_source = "am"` keeps it as each head's verbatim part."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.compaction import (
    BIASES,
    SELECTIONS,
    Compaction,
    RowStats,
    SpanReadout,
    check_options,
    compact_rows,
    head_counts,
    row_stats,
)
from vkv.compress.head_budget import HeadBudget, head_budget_setting
from vkv.compress.history import HistoryWork
from vkv.compress.on_policy import FitOptions, compact_on_policy
from vkv.compress.reconstruction import chunk_setting, reconstruction_pass
from vkv.compress.reference_queries import (
    cap_setting,
    reference_queries,
    repeat_queries,
    source_setting,
    token_subset,
)
from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.kv.segment import Segment
from vkv.progress import counted
from vkv.settings import check_fields, setting
from vkv.stages import stage


@dataclass
class AttentionMatchingFit:
    """Attention matching's options, each a field with the reference's fast headline variant as its default, and the
    fit of a span or turn (`compaction`): the method am and vkv's am-source recipe share them."""

    selection: str = setting(
        "rms",
        "how each head's keys are chosen: rms, the highest root-mean-square attention over the reference queries; mean, "
        "the highest mean attention; omp, orthogonal matching pursuit on the masses (slower)",
        SELECTIONS,
    )
    bias: str = setting(
        "nnls",
        "each kept entry's bias: nnls, the reference's bounded least squares on absolute masses; fit, exact NNLS on "
        "each query's relative mass; shared, log(n / t) for every entry; none",
        BIASES,
    )
    values: str = setting(
        "refit", "refit: least squares on the read-outs; keep: the kept entries' own values", ("refit", "keep")
    )
    ridge: float = setting(
        0.0, "pulls refitted values toward the kept entries' own (0: plain least squares)", minimum=0
    )
    queries: str = source_setting()
    max_queries: int = cap_setting()
    on_policy: bool = setting(
        True, "take each layer's read-out queries with the earlier layers already compacted (repeat queries only)"
    )
    head_budget: HeadBudget = head_budget_setting(HeadBudget.GLOBAL)
    head_cap: float = setting(
        0.75, "no head keeps more than this share of the span when entries move between heads", minimum=0, above=True
    )
    omp_step: int = setting(1, "keys OMP picks between refits of their weights (the reference's k_choice)", minimum=1)
    chunk: int = chunk_setting()

    def __post_init__(self) -> None:  # on its own, as vkv's recipe builds it (method am checks its options itself)
        check_fields(self)

    def compaction(self, work: SpanWork, budget: int) -> tuple[Compaction, int]:
        """The span compacted to `budget` entries per KV head on average (rows layer-major), and the reference
        queries each KV head's fit read."""
        keys, values = work.span_kv()
        if self.head_cap > 1:
            raise VkvError(f"am: head_cap is a share of the span, at most 1, not {self.head_cap}")
        try:
            check_options(self.selection, self.bias, self.values, self.head_budget)
            return self._compact(work, keys, values, budget)
        except ValueError as exc:
            raise VkvError(f"am: {exc}") from None

    def _compact(self, work: SpanWork, keys: torch.Tensor, values: torch.Tensor, budget: int):
        """(the Compaction of every row, the reference queries per KV head), fitted on the model's device and
        returned on the CPU, where segments keep their entries; each layer's statistics, then with `on_policy` each
        layer's fit, are counted on stderr."""
        device = work.lm.device
        keys, values = keys.to(device), values.to(device)
        layers, kv_heads, n, _ = keys.shape
        with stage("reference queries", device):  # the reconstruction pass within it is its own stages
            queries = reference_queries(work, self.queries, self.max_queries, self.chunk)  # [layers, kv_heads, m, D]
        readout = SpanReadout.per_head(queries, keys, values)
        label = f"am: {work.span_length} tokens, {queries.shape[2]} queries per head"
        with counted(label, 2 * layers if self.live else layers + 1) as done:
            with stage("statistics", device):
                stats = []
                for layer in range(layers):  # a layer's rows at a time: what the queries read is kept off-policy only
                    stats.append(
                        row_stats(readout.rows(slice(layer * kv_heads, (layer + 1) * kv_heads)), not self.live)
                    )
                    done()
                stats = RowStats.cat(stats)
                scores = stats.key_scores(self.selection).reshape(layers, kv_heads, n)
                counts, index = head_counts(scores, budget, self.head_budget, self.head_cap)
            fixed = None if self.head_budget.per_head else index
            options = FitOptions(self.selection, self.bias, self.values, self.ridge, self.omp_step)
            if not self.live:
                flat = None if fixed is None else fixed.reshape(layers * kv_heads, -1)
                args = (options.selection, options.bias, options.values, options.ridge, flat, options.omp_step, stats)
                result = compact_rows(readout, counts.reshape(-1), *args)
                done()
                return result.to("cpu"), queries.shape[2]
            del stats, readout
            picked = token_subset(
                work.lm,
                reconstruction_pass(work, self.chunk, score=False).queries.shape[2],
                self.max_queries,
                work.seed,
            )
            repeat = len(picked) * (work.lm.spec.num_heads // kv_heads)
            extra = queries[:, :, repeat:] if queries.shape[2] > repeat else None  # the span's own, kept as they are
            result: Compaction = compact_on_policy(
                work, keys, values, counts, picked, options, self.chunk, fixed, extra, lambda _: done()
            )
        return result.to("cpu"), queries.shape[2]

    def refit_history(self, work: HistoryWork, entries: int) -> Segment:
        """A running cache's history (entries compacted before, with their biases) fitted again to `entries` per KV head
        on average, split over heads by the fit's head budget (a head keeps at most what it holds): the same selection,
        β and values, on reference queries from a read-out of the history's text on top of the cache before it and the
        history itself (the repeat source), taken once for every layer (off-policy: earlier layers are not refitted
        first)."""
        if self.selection == "omp":
            raise VkvError("am: OMP selection cannot refit entries that already carry biases; use rms or mean")
        history, device = work.history, work.lm.device
        layers, kv_heads, slots, dim = history.keys.shape
        rows = layers * kv_heads
        with stage("reference queries", device):
            queries = repeat_queries(work, self.chunk, self.max_queries)  # [layers, kv_heads, m, D]
        real = history.real.reshape(rows, slots).to(device)
        readout = SpanReadout(
            queries.reshape(rows, -1, dim),
            *(t.reshape(rows, slots, dim).to(device) for t in (history.keys, history.values)),
            history.bias.reshape(rows, slots).to(device),
        )
        with stage("statistics", device):
            stats = row_stats(readout)
        unheld = ~real  # padding slots draw no attention; they must not tie with entries that draw none either
        stats.rms, stats.mean = stats.rms.masked_fill(unheld, -1.0), stats.mean.masked_fill(unheld, -1.0)
        scores = stats.key_scores(self.selection).reshape(layers, kv_heads, slots)
        counts, _ = head_counts(scores, min(entries, slots), self.head_budget, self.head_cap)
        counts = torch.minimum(counts.reshape(-1).to(real.device), real.sum(-1))
        options = (self.selection, self.bias, self.values, self.ridge, None, self.omp_step, stats)
        with stage("fit", device):
            result = compact_rows(readout, counts, *options).to("cpu")
        shape = (layers, kv_heads, -1)
        return history.keep(
            result.index.reshape(shape),
            result.real.reshape(shape),
            result.values.reshape(layers, kv_heads, -1, dim),
            result.bias.reshape(shape),
        )

    @property
    def live(self) -> bool:
        """Whether each layer's read-out queries are taken on-policy."""
        return self.on_policy and self.queries in ("repeat", "repeat+span")
