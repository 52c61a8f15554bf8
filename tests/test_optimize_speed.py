"""The fast optimiser against the straightforward computation: same loss and gradients, batching, the
least-squares start, the memory plan against measurement, and the benchmark's logic on a tiny model."""

import ctypes
import math
from dataclasses import replace

import pytest
import torch

from tests.conftest import build_tiny
from vkv.compress.budget import entries_at
from vkv.compress.optimise import OptimConfig, optimise, optimise_batch
from vkv.compress.pooling import block_weights, partition
from vkv.compress.positions import virtual_positions
from vkv.compress.targets import build_targets
from vkv.kv.prefix import KVPrefix
from vkv.lm.capture import capture_span
from vkv.lm.frozen import FrozenLM
from vkv.tools.measure import saved_activation_mb, working_memory
from vkv.tools.memory import load_config, plan
from vkv.tools.optimizer_runs import bench_quant
from vkv.tools.optimizer_steps import prepare_span, reference_losses, vkv_loss_and_grad

TEXT = (
    "The project hashes passwords with bcryptjs. Tests use the built-in node:test runner. "
    "The default JWT secret is dev-secret and finished tasks have the status done. Deploys go out on Fridays."
)

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def make_problem(lm, start, end, ratio=3.0, kind="v", text=TEXT):
    ids = torch.tensor(lm.tokenizer(text, add_special_tokens=False)["input_ids"])
    acts, cache = capture_span(lm, ids, start, end, keep_cache=True)
    k = entries_at(end - start, ratio)
    blocks = partition(end - start, k)
    targets = build_targets(lm, ids, acts, blocks, block_weights("surprisal", blocks, acts.surprisal), kind)
    return KVPrefix.from_cache(cache, start), targets, virtual_positions("interpolate", start, end, k)


def reference_loss_and_grad(lm, prefix, targets, positions, embeddings):
    leaf = embeddings.clone().requires_grad_(True)
    loss = reference_losses(lm, prefix, targets, positions, leaf).mean()
    loss.backward()
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("kind", ["v", "kv-pre-rope", "kv-post-rope"])
def test_fast_path_has_the_full_forwards_loss_and_gradients(tiny, kind):
    prefix, targets, positions = make_problem(tiny, 7, 31, kind=kind)
    embeddings = targets.pooled_embeddings + 0.05 * torch.randn(targets.pooled_embeddings.shape)
    config = OptimConfig(precision="fp32")
    loss, grad = vkv_loss_and_grad(tiny, prefix, targets, positions, embeddings, config)
    ref_loss, ref_grad = reference_loss_and_grad(tiny, prefix, targets, positions, embeddings)
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-5)


def test_padded_batch_forward_equals_each_row(tiny_llama):
    lm = tiny_llama
    problems = [make_problem(lm, 5, 20), make_problem(lm, 12, 33, ratio=2.0), make_problem(lm, 0, 9)]
    from vkv.compress.kv_loss import Batch

    batch = Batch.build(lm, problems)
    assert batch.token_mask is not None and batch.prefix.valid is not None
    n = max(batch.sizes)
    x = torch.stack(
        [torch.cat([t.pooled_embeddings, torch.zeros(n - t.k, t.pooled_embeddings.shape[1])]) for _, t, _ in problems]
    )
    for fast in (True, False):
        keys, values = lm.forward_kv(x, batch.positions, batch.prefix, token_mask=batch.token_mask, fast=fast)
        for b, (prefix, targets, positions) in enumerate(problems):
            k1, v1 = lm.forward_kv(targets.pooled_embeddings[None], positions, prefix, fast=True)
            for layer in range(lm.spec.num_layers):
                torch.testing.assert_close(keys[layer][b : b + 1, :, : targets.k], k1[layer], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(values[layer][b : b + 1, :, : targets.k], v1[layer], atol=1e-5, rtol=1e-5)


def test_batched_optimisation_equals_one_at_a_time(tiny_llama):
    lm = tiny_llama
    problems = [make_problem(lm, 5, 20), make_problem(lm, 12, 33, ratio=2.0), make_problem(lm, 0, 9)]
    config = OptimConfig(steps=10, lr=1e-2, precision="fp32")
    alone = [optimise(lm, *p, config) for p in problems]
    # a target loss that exactly one problem reaches mid-run, so the batch shrinks while the others go on
    first, target = next(
        (p, a.trace[s])
        for s in range(2, 9)
        for p, a in enumerate(alone)
        if a.trace[s] < min(a.trace[:s]) and all(a.trace[s] < min(o.trace) for q, o in enumerate(alone) if q != p)
    )
    early = replace(config, target_loss=target)
    alone = [optimise(lm, *p, early) for p in problems]
    together = optimise_batch(lm, problems, early)
    assert [a.stopped == "target" for a in alone] == [p == first for p in range(3)]
    for a, b in zip(alone, together):
        assert a.steps == b.steps and a.stopped == b.stopped
        assert b.batch_size == 3
        torch.testing.assert_close(torch.tensor(b.trace), torch.tensor(a.trace), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(b.embeddings, a.embeddings, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(b.per_layer_loss), torch.tensor(a.per_layer_loss), atol=1e-5, rtol=1e-4)


def test_optimiser_matches_torch_adam_on_the_reference_loop(tiny_llama):
    """Same settings → the same trajectory as torch.optim.Adam on the straightforward loss."""
    from vkv.tools.optimizer_steps import reference_optimise

    lm = tiny_llama
    prefix, targets, positions = make_problem(lm, 6, 30)
    ref_losses = []
    reference_optimise(
        lm, prefix, targets, positions, steps=6, lr=2e-2, on_step=lambda _step, loss: ref_losses.append(loss)
    )
    config = OptimConfig(steps=6, lr=2e-2, patience=100, precision="fp32", init="pooled", betas=(0.9, 0.999))
    result = optimise(lm, prefix, targets, positions, config)
    torch.testing.assert_close(torch.tensor(result.trace), torch.tensor(ref_losses), atol=1e-5, rtol=1e-4)


def test_least_squares_start_matches_layer_0_better_than_pooling(tiny):
    prefix, targets, positions = make_problem(tiny, 4, 40, ratio=4.0)
    pooled = optimise(tiny, prefix, targets, positions, OptimConfig(steps=0, init="pooled"))
    lstsq = optimise(tiny, prefix, targets, positions, OptimConfig(steps=0, init="lstsq"))
    assert lstsq.per_layer_loss[0] < 0.5 * pooled.per_layer_loss[0], (lstsq.per_layer_loss[0], pooled.per_layer_loss[0])


def test_zero_layer_weights_stop_the_forward_early_and_weights_get_no_gradients(tiny_llama):
    lm = tiny_llama
    prefix, targets, positions = make_problem(lm, 5, 25)
    calls = []
    deepest = lm.model.model.layers[2].input_layernorm
    handle = deepest.register_forward_hook(lambda *a: calls.append(1))
    try:
        config = OptimConfig(steps=4, init="pooled", layer_weights=(1.0, 1.0, 0.0))
        result = optimise(lm, prefix, targets, positions, config)
    finally:
        handle.remove()
    assert len(calls) == 1  # only the closing pass that reports every layer's loss
    assert len(result.per_layer_loss) == 3 and result.best_loss < result.initial_loss
    assert all(p.grad is None for p in lm.model.parameters())


def test_bf16_autocast_keeps_fp32_embeddings_and_optimises(tiny_llama):
    prefix, targets, positions = make_problem(tiny_llama, 5, 25)
    config = OptimConfig(steps=6, lr=2e-3, precision="bf16")
    result = optimise(tiny_llama, prefix, targets, positions, config)
    exact = optimise(tiny_llama, prefix, targets, positions, replace(config, precision="fp32"))
    assert result.embeddings.dtype == torch.float32
    assert math.isfinite(result.best_loss) and result.best_loss < result.initial_loss
    assert abs(result.initial_loss - exact.initial_loss) < 0.02 * exact.initial_loss


def test_a_16_bit_model_optimises_without_autocast(smol_tokenizer):
    """`--quant bf16` without bf16 autocast (precision fp32, or a CPU without AMX): the attention output, computed
    against fp32 masks, goes into the model's own bf16 projections."""
    tiny = build_tiny("llama", smol_tokenizer)
    lm = FrozenLM(tiny.model.to(torch.bfloat16), smol_tokenizer, name="tiny-bf16", quant="bf16", device=tiny.device)
    prefix, targets, positions = make_problem(lm, 5, 25)
    result = optimise(lm, prefix, targets, positions, OptimConfig(steps=3, lr=2e-3, precision="fp32"))
    assert math.isfinite(result.best_loss) and result.best_loss <= result.initial_loss


def test_plan_weights_and_activations_match_the_tiny_model(tiny_llama):
    lm = tiny_llama
    prefix, targets, positions = make_problem(lm, 10, 34)
    estimate = plan(
        lm.model.config, quant="fp32", window=34, span=24, ratio=24 / targets.k, device="cpu", precision="fp32"
    )
    params = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    assert abs(estimate.weights - params) / params < 0.01
    x = targets.pooled_embeddings
    measured = saved_activation_mb(
        lm,
        lambda: vkv_loss_and_grad(lm, prefix, targets, positions, x, OptimConfig(precision="fp32")),
        prefix.keys + prefix.values,
    )
    assert 0.8 < (estimate.activations / 2**20) / measured < 1.25, (estimate.activations / 2**20, measured)


def test_reference_setup_fits_in_32_gib():
    config = load_config("Qwen/Qwen2.5-Coder-7B-Instruct")
    assert (config.num_hidden_layers, config.hidden_size, config.num_key_value_heads) == (28, 3584, 4)
    p = plan(config, quant="8bit", window=4096, ratio=3.2, device="cuda", capacity_gib=32)
    assert 7.5 < p.weights / 2**30 < 8.5  # 6.5 G int8 parameters + fp16 embeddings and LM head
    assert p.virtual_tokens == 1280 and p.peak < 32 * 2**30


def test_bench_logic_runs_on_a_tiny_model(tiny_llama, mini_transcript_path):
    lm = tiny_llama
    lm.quant = "fp32"
    span = prepare_span(lm, mini_transcript_path, "turns:3-4", 3.2)
    record = bench_quant(lm, span, steps=3, lr=1e-2, tuned=OptimConfig(), log=lambda *a: None)
    names = [r["run"] for r in record["runs"]]
    assert names == ["reference loop", "vkv, reference settings", "vkv, defaults"]
    reference, same = record["runs"][0], record["runs"][1]
    assert same["steps_to_reference_loss"] is not None and same["steps_to_reference_loss"] <= 3
    assert abs(same["final_loss"] - reference["final_loss"]) < 1e-4
    assert record["floor"]["gflop_per_step"] > 0 and record["floor"]["fp32"]["seconds_per_step"] > 0
    assert all(r["step_over_floor"] > 0 for r in record["runs"])
    assert "aten::" in record["profile"]["vkv_defaults"]["table"]


# ---- the real test model --------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("quant", ["fp32", "8bit"])
def test_fast_path_matches_full_forward_on_the_test_model(quant, smol, smol8):
    lm = smol if quant == "fp32" else smol8
    prefix, targets, positions = make_problem(lm, 12, 40)
    embeddings = targets.pooled_embeddings
    loss, grad = vkv_loss_and_grad(lm, prefix, targets, positions, embeddings, OptimConfig(precision="fp32"))
    ref_loss, ref_grad = reference_loss_and_grad(lm, prefix, targets, positions, embeddings)
    tol = 1e-5 if quant == "fp32" else 1e-3  # int8 matmuls round differently with the prefix concatenated
    torch.testing.assert_close(loss, ref_loss, atol=tol, rtol=tol)
    torch.testing.assert_close(grad, ref_grad, atol=tol, rtol=max(tol, 1e-4) * 10)


@pytest.mark.integration
@pytest.mark.parametrize("quant", ["fp32", "8bit"])
def test_plan_estimate_is_within_a_factor_of_measured_memory(quant, smol, smol8, mini_transcript_path):
    """Weights within 5%; fp32 activations kept for backward within 15% of autograd's saved tensors; one
    optimisation's working memory (peak RSS above the loaded model and prefix) within a factor of 2 of the
    plan in fp32. In 8-bit on the CPU only the weights are checked: bitsandbytes' CPU int8 matmuls allocate a
    dequantised copy of each weight per call, so peak RSS there measures the allocator, not the plan."""
    lm = smol if quant == "fp32" else smol8
    span = prepare_span(lm, mini_transcript_path, "turns:3-7", 3.2)
    n = span.targets.k
    estimate = plan(
        lm.model.config,
        quant=quant,
        window=span.end,
        span=span.end - span.start,
        ratio=(span.end - span.start) / n,
        device="cpu",
        precision="fp32",
    )
    params = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    assert abs(estimate.weights - params) / params < 0.05, (estimate.weights, params)
    x = span.targets.pooled_embeddings
    saved = saved_activation_mb(
        lm,
        lambda: vkv_loss_and_grad(lm, *span.problem, x, OptimConfig(precision="fp32")),
        span.prefix.keys + span.prefix.values,
    )
    if quant == "fp32":  # bitsandbytes keeps each int8 layer's input outside autograd's saved tensors
        assert 0.85 < (estimate.activations / 2**20) / saved < 1.15, (estimate.activations / 2**20, saved)
    if quant == "8bit":
        return  # bitsandbytes' CPU path dequantises every weight per call; RSS then tracks glibc's arenas, not the plan
    # glibc otherwise raises its mmap threshold after the first large free and keeps later tensors' freed heap
    # resident, so peak RSS would measure its fragmentation (about twice the live bytes) rather than the plan
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    optimise(lm, *span.problem, OptimConfig(steps=1, precision="fp32"))  # one-time allocations (thread pools)
    peaks = []
    for _ in range(3):  # RSS only gains from outside noise (other code's pages faulted in): the least of 3 is it
        with working_memory(lm.device) as mem:
            optimise(lm, *span.problem, OptimConfig(steps=3, precision="fp32"))
        if mem["mb"] is None:
            pytest.skip("peak RSS cannot be reset on this platform")
        peaks.append(mem["mb"])
    factor = 2.0
    ratio = (estimate.optimisation_working / 2**20) / max(min(peaks), 1.0)
    assert 1 / factor < ratio < factor, (estimate.optimisation_working / 2**20, peaks)
