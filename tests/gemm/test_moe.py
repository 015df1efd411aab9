"""One MoE layer's routed experts as one call: each candidate against a token-by-token loop
written out here, and the gemm runner's MoE rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from k25exp.gemm import moe

E, H, I, K = 16, 512, 64, 4  # tiny_kimi's layer at TP 2: 16 experts, top-4, I = 128 / 2


def by_hand(x, w13, w2, tw, ti):
    inter = w2.shape[2]
    out = torch.zeros(x.shape[0], w2.shape[1])
    for t in range(x.shape[0]):
        for j in range(ti.shape[1]):
            e = int(ti[t, j])
            h = w13[e].float() @ x[t].float()
            out[t] += tw[t, j] * (w2[e].float() @ (F.silu(h[:inter]) * h[inter:]))
    return out


@pytest.mark.parametrize("c", [1, 3, 32])
@pytest.mark.parametrize("name", ["reference_grouped_moe",
                                  pytest.param("vllm_fused_moe", marks=pytest.mark.vllm)])
def test_candidates_match_a_token_by_token_loop(name, c):
    if name == "vllm_fused_moe":
        pytest.importorskip("vllm")
    w13, w2 = moe.make_weights(E, H, I, torch.bfloat16, "cpu", seed=0)
    tw, ti = moe.route(c, E, K, seed=c)
    x = torch.randn(c, H, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    want = by_hand(x, w13, w2, tw, ti)
    got = moe.CANDIDATES[name](w13, w2).run(x, tw, ti).float()
    assert got.shape == (c, H)
    assert (got - want).abs().max() / want.abs().max() < 2e-2  # bf16 output, fp32 loop


def test_routing_picks_k_distinct_experts_with_weights_summing_to_one():
    tw, ti = moe.route(64, E, K, seed=3)
    assert ti.dtype == torch.int32 and tw.dtype == torch.float32
    assert all(len(set(row.tolist())) == K for row in ti) and int(ti.max()) < E
    assert torch.allclose(tw.sum(-1), torch.ones(64))
    assert torch.equal(moe.route(64, E, K, seed=3)[1], ti)  # deterministic


def test_uniform_routing_draws_as_vllms_simulator_does():
    """uniform: k distinct ids per token, weights 1 (vLLM's uniform_random); over many tokens
    every expert is picked about c·k/E times (by hand: 4096 · 4 / 16 = 1024 each, a binomial
    sd of ~30: no expert outside ±200)."""
    tw, ti = moe.route(4096, E, K, seed=5, routing="uniform")
    assert all(len(set(row.tolist())) == K for row in ti[:256])
    assert torch.equal(tw, torch.ones(4096, K))
    counts = torch.bincount(ti.reshape(-1).long(), minlength=E)
    assert int(counts.sum()) == 4096 * K and int((counts - 1024).abs().max()) < 200


def test_skewed_routing_draws_hot_experts_with_the_expected_frequencies():
    """skewed: id = floor(sigmoid(z) · E), z ~ N(0, 1). By hand for E = 16: expert 0 iff
    z < logit(1/16) = −2.708, Φ = 0.00338; experts 7 and 8 (sigmoid(z) in [7/16, 9/16),
    z in [−0.2513, 0.2513)) take 2 · 0.0992 = 0.1984 of the draws."""
    c = 20000
    tw, ti = moe.route(c, E, K, seed=9, routing="skewed")
    n = c * K
    counts = torch.bincount(ti.reshape(-1).long(), minlength=E).double() / n
    assert float(counts[7] + counts[8]) == pytest.approx(0.1984, abs=0.005)
    assert float(counts[0]) == pytest.approx(0.00338, abs=0.0015)
    assert float(counts[7]) > 10 * float(counts[0])  # hot in the middle
    assert torch.allclose(tw.sum(-1), torch.ones(c)) and bool((tw >= 0).all())


@pytest.mark.parametrize("name", ["reference_grouped_moe",
                                  pytest.param("vllm_fused_moe", marks=pytest.mark.vllm)])
def test_a_skewed_draw_with_a_repeated_expert_still_matches_the_loop(name):
    """vLLM's normal_routing may give one token the same expert twice; the candidates must
    sum both (the token-by-token loop above does)."""
    if name == "vllm_fused_moe":
        pytest.importorskip("vllm")
    w13, w2 = moe.make_weights(E, H, I, torch.bfloat16, "cpu", seed=0)
    tw = torch.tensor([[0.5, 0.25, 0.125, 0.125]])
    ti = torch.tensor([[3, 3, 7, 3]], dtype=torch.int32)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    got = moe.CANDIDATES[name](w13, w2).run(x, tw, ti).float()
    want = by_hand(x, w13, w2, tw, ti)
    assert (got - want).abs().max() / want.abs().max() < 2e-2


@pytest.mark.vllm  # vLLM's fused MoE is one of the timed candidates
def test_gemm_runner_times_the_moe_layer_per_batch(tmp_path):
    pytest.importorskip("vllm")
    from k25exp.config.validate import to_typed
    from k25exp.runners import runner_for
    from k25exp.tracking import MemoryRecorder
    from tests.conftest import compose_cfg

    cfg = to_typed(compose_cfg("experiment=gemm", "model=tiny_kimi", "experiment.shapes=[expert_down]",
                               "experiment.m_values=[1]", "experiment.moe_batches=[1,8]",
                               "experiment.calls=3", "experiment.kernels=[torch_bf16]"),
                   gpu_count=lambda: 0)
    rec = MemoryRecorder()
    runner_for(cfg.experiment)(cfg, tmp_path, rec)
    for name in ("vllm_fused_moe", "reference_grouped_moe"):
        lat = rec.latest(f"moe.tp2/{name}/latency_us")
        assert sorted(lat) == [1, 8] and all(v > 0 for v in lat.values())
        assert rec.latest(f"moe.tp2/{name}/max_rel_err")[8] < 2e-2
        # 1 token touches its 4 experts; 8 tokens touch between 4 and 16
        assert rec.latest(f"moe.tp2/{name}/experts_touched")[1] == 4
        assert 4 <= rec.latest(f"moe.tp2/{name}/experts_touched")[8] <= 16
    assert "reference, not vLLM's path" in (tmp_path / "notes.txt").read_text()


def test_a_layer_too_big_for_the_budget_is_skipped_with_its_size(tmp_path):
    from k25exp.config.validate import to_typed
    from k25exp.runners import runner_for
    from k25exp.tracking import MemoryRecorder
    from tests.conftest import compose_cfg

    cfg = to_typed(compose_cfg("experiment=gemm", "experiment.shapes=[expert_down]",
                               "experiment.m_values=[1]", "experiment.calls=2",
                               "experiment.kernels=[torch_bf16]"), gpu_count=lambda: 0)
    rec = MemoryRecorder()
    runner_for(cfg.experiment)(cfg, tmp_path, rec)
    # Kimi at TP 2: 384 × 3 × 1024 × 7168 × 2 B = 15.75 GiB
    assert "= 15.8 GiB > experiment.moe_max_weight_gib=8" in rec.tags["skipped.moe.tp2"]


@pytest.mark.cuda
@pytest.mark.parametrize("c", [1, 32])
def test_reference_moe_on_cuda_matches_the_loop(c):
    w13, w2 = moe.make_weights(E, H, I, torch.bfloat16, "cpu", seed=0)
    tw, ti = moe.route(c, E, K, seed=c)
    x = torch.randn(c, H, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    want = by_hand(x, w13, w2, tw, ti)
    got = moe.reference_grouped_moe(w13.cuda(), w2.cuda()).run(x.cuda(), tw.cuda(), ti.cuda()).float().cpu()
    assert (got - want).abs().max() / want.abs().max() < 2e-2


def _moe_only(tmp_path, *overrides):
    from k25exp.config.validate import to_typed
    from k25exp.runners import runner_for
    from k25exp.tracking import MemoryRecorder
    from tests.conftest import compose_cfg

    cfg = to_typed(compose_cfg("experiment=gemm", "model=tiny_kimi", "experiment.m_values=[1]",
                               "experiment.moe_batches=[1,2]", "experiment.calls=2",
                               "experiment.moe_kernels=[reference_grouped_moe]", *overrides),
                   gpu_count=lambda: torch.cuda.device_count())
    rec = MemoryRecorder()
    runner_for(cfg.experiment)(cfg, tmp_path, rec)
    assert sorted(rec.latest("moe.tp2/reference_grouped_moe/latency_us")) == [1, 2]
    return rec


def test_a_moe_only_run_still_says_how_it_was_timed(tmp_path):
    # the only dense kernel is W4A16, skipped on the unquantized model: no dense figure is
    # timed, and the MoE layer's figures still carry their timing tags
    rec = _moe_only(tmp_path, "experiment.shapes=[expert_down]", "experiment.baseline=torch_int4",
                    "experiment.kernels=[torch_int4]")
    assert "tiny_kimi has no int4 weights" in rec.tags["skipped.torch_int4"]
    assert rec.tags["timing.timer"] == "perf_counter_ns" and rec.tags["timing.mode"] == "eager"
    assert rec.tags["timing.calls"] == "2"


@pytest.mark.cuda
def test_graph_timing_names_the_moe_reference_it_could_not_graph(tmp_path):
    # the dense GEMM is replayed from a CUDA graph; the MoE reference's loop over experts
    # depends on the routing, so it is timed eagerly, and the tags say so for that figure only
    rec = _moe_only(tmp_path, "hardware=h200_x1", "experiment.tp=2", "experiment.shapes=[expert_down]",
                    "experiment.kernels=[torch_bf16]", "experiment.graph=true")
    assert rec.tags["timing.mode"] == "graph"
    assert rec.tags["timing.moe.tp2/reference_grouped_moe.mode"] == "eager"
    assert not any(k.startswith("timing.expert_down") for k in rec.tags)


def test_the_int4_experts_marlin_gets_are_within_half_a_step_and_packed_gptq_style():
    """What vllm_marlin_moe hands vLLM's repack: symmetric int4, group 32, every weight within
    half a step of its own (the step: absmax / 7 rounded to bf16, up to 2^-8 more; plus the
    dequantized value's own bf16 rounding, 2^-8 of it), and codes + 8 packed 8 per int32
    along K, lowest nibble first, as [E, K/8, N]."""
    w13, _ = moe.make_weights(E, H, 128, torch.bfloat16, "cpu", seed=0)
    q, scales, d13 = moe._quantize_experts(w13, 32)
    g = w13.float().reshape(E, 256, H // 32, 32)
    step = g.abs().amax(-1, keepdim=True) / 7 * (1 + 2 ** -8)
    d = d13.float().reshape(g.shape)
    assert ((d - g).abs() <= step / 2 + d.abs() * 2 ** -8 + 1e-7).all()
    assert int(q.min()) >= -7 and int(q.max()) <= 7 and scales.shape == (E, 256, H // 32)
    packed = moe._gptq_pack_experts(q[:2])
    assert packed.shape == (2, H // 8, 256) and packed.dtype == torch.int32
    e, k8, n = 1, 3, 5  # one word by hand: expert 1, K rows 24..31, column 5
    want = sum((int(q[e, n, 8 * k8 + i]) + 8) << (4 * i) for i in range(8))
    assert int(packed[e, k8, n]) & 0xFFFFFFFF == want


def test_marlin_moe_is_cuda_only_and_says_so():
    w13, w2 = moe.make_weights(E, H, 128, torch.bfloat16, "cpu", seed=0)
    with pytest.raises(moe.Unavailable, match="Marlin MoE needs CUDA; the weights are on cpu"):
        moe.vllm_marlin_moe(w13, w2, 32)


@pytest.mark.cuda
@pytest.mark.vllm
@pytest.mark.parametrize("c", [1, 8, 64])
def test_marlin_moe_matches_a_token_by_token_loop_on_its_int4_weights(c):
    """vLLM's Marlin W4A16 MoE (the kernel of a compressed-tensors INT4 checkpoint) against
    the loop above on the dequantized weights it holds: 16 experts, H 512, I 128 (Marlin's
    tiles need I % 64 and H % 128), top-4, group 32."""
    w13, w2 = moe.make_weights(E, H, 128, torch.bfloat16, "cpu", seed=0)
    try:
        p = moe.vllm_marlin_moe(w13.cuda(), w2.cuda(), 32)
    except moe.Unavailable as e:
        pytest.xfail(str(e))
    d13, d2 = (t.cpu() for t in p.reference)
    tw, ti = moe.route(c, E, K, seed=c)
    x = torch.randn(c, H, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    want = by_hand(x, d13, d2, tw, ti)
    got = p.run(x.cuda(), tw.cuda(), ti.cuda()).float().cpu()
    assert got.shape == (c, H) and p.quantized
    assert (got - want).abs().max() / want.abs().max() < 2e-2


def test_a_rank_models_experts_are_the_ranks_own(tmp_path):
    """model.tp_rank_of=8: one TP-8 rank of Kimi has 384 experts of I = 2048 / 8 = 256, timed
    as they are (tp 1), not divided again: 384 × 3 × 256 × 7168 × 2 B = 3.94 GiB."""
    from k25exp.config.validate import to_typed
    from k25exp.runners import runner_for
    from k25exp.tracking import MemoryRecorder
    from tests.conftest import compose_cfg

    cfg = to_typed(compose_cfg("experiment=gemm", "model=kimi_k25_int4", "model.tp_rank_of=8",
                               "hardware=h200_x1", "experiment.device=cpu",
                               "experiment.shapes=[expert_down]", "experiment.m_values=[1]",
                               "experiment.calls=2", "experiment.kernels=[torch_bf16]",
                               "experiment.moe_max_weight_gib=1"), gpu_count=lambda: 1)
    rec = MemoryRecorder()
    runner_for(cfg.experiment)(cfg, tmp_path, rec)
    assert rec.tags["skipped.moe.tp1"].startswith(
        "384 experts x [512 x 7168] + [7168 x 256] bf16 = 3.9 GiB > experiment.moe_max_weight_gib=1")
