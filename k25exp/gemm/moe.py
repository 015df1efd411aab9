"""The routed experts of one MoE layer at a batch of c tokens, run as one call.

vLLM never runs experts one by one: its FusedMoE layer hands all c × top_k (token, expert)
pairs to one fused kernel. The candidates here time that call:

* `vllm_fused_moe`: vLLM's own fused MoE op on bf16 weights. CPU build: `_C::cpu_fused_moe`
  on weights prepacked by `_C::prepack_moe_weight`, isa `amx` where the CPU has AMX tiles,
  else `vec` (as vLLM's CPUUnquantizedExperts picks). CUDA: vLLM's `fused_experts` (its
  Triton kernel), the path of a bf16 checkpoint. Unavailable without vLLM (the reason is
  logged).
* `vllm_marlin_moe`: vLLM's Marlin W4A16 MoE kernel (`fused_marlin_moe`) on INT4 weights,
  symmetric, group 32, repacked by vLLM's own `gptq_marlin_moe_repack` and
  `marlin_moe_permute_scales`: the kernel CompressedTensorsWNA16MarlinMoEMethod runs for a
  compressed-tensors W4A16 checkpoint such as Kimi-K2.5 INT4 (MARLIN WNA16 MoE in its log).
  CUDA only. Its output is checked against the dequantized weights.
* `reference_grouped_moe`: plain torch, named as a reference: tokens sorted by expert, two
  matmuls and SiLU-and-mul per active expert, weighted scatter-add. Not vLLM's path.

Each candidate prepares its weights once (`CANDIDATES[name](w13, w2, group_size)` →
`Prepared`) and is then called per batch with that batch's routing.

Weights: w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I] with I the TP shard of
moe_intermediate_size, as vLLM's FusedMoE stores them. Routing: deterministic random scores
through sigmoid, top-k, weights renormalised (Kimi's sigmoid top-k without the correction
bias, which changes which experts, not how many), or as vLLM's routing simulator draws them
(model.routing: uniform, skewed; see route()).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

class Unavailable(RuntimeError):
    """The candidate cannot run here; the message says why."""


def route(c: int, n_experts: int, top_k: int, seed: int, device="cpu",
          routing: str = "learned") -> tuple[Tensor, Tensor]:
    """(topk_weights float32 [c, k], topk_ids int32 [c, k]) for c tokens, drawn as the server
    routes them under model.routing (k25exp.model.routing), with a seeded generator:

    uniform  vLLM's uniform_random: top-k of uniform scores (k distinct ids), weights 1
    skewed   vLLM's normal_routing: each id floor(sigmoid(z) · E), z ~ N(0, 1), clamped to
             E − 1; weights |N(0, 1)| normalised
    learned  no trained router here: sigmoid of normal scores, top-k, renormalised (Kimi's
             scoring without the correction bias); it spreads tokens as uniform does
    """
    g = torch.Generator().manual_seed(seed)
    if routing == "uniform":
        ids = torch.rand(c, n_experts, generator=g).topk(top_k, dim=-1).indices
        w = torch.ones(c, top_k)
    elif routing == "skewed":
        z = torch.randn(c, top_k, generator=g)
        ids = (z.sigmoid() * n_experts).long().clamp(0, n_experts - 1)
        w = torch.randn(c, top_k, generator=g).abs()
        w = w / w.sum(-1, keepdim=True)
    elif routing == "learned":
        scores = torch.randn(c, n_experts, generator=g).sigmoid()
        w, ids = scores.topk(top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
    else:
        raise ValueError(f"routing={routing!r}: expected learned, uniform or skewed")
    return w.float().contiguous().to(device), ids.to(torch.int32).contiguous().to(device)


def make_weights(n_experts: int, hidden: int, inter: int, dtype: torch.dtype, device,
                 seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(n_experts, 2 * inter, hidden, generator=g) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(n_experts, hidden, inter, generator=g) / inter ** 0.5).to(dtype)
    return w13.to(device), w2.to(device)


def reference_moe(x: Tensor, w13: Tensor, w2: Tensor, topk_w: Tensor, topk_ids: Tensor) -> Tensor:
    """Σ_k w_k · down_e(silu(gate_e x) · up_e x) over each token's top-k experts e."""
    c, k = topk_ids.shape
    inter = w2.shape[2]
    flat = topk_ids.reshape(-1).long()
    order = flat.argsort()
    token_of = order // k  # the token of each sorted (token, expert) pair
    out = torch.zeros(c, x.shape[1], dtype=torch.float32, device=x.device)
    experts, counts = flat[order].unique_consecutive(return_counts=True)
    start = 0
    for e, n in zip(experts.tolist(), counts.tolist()):
        pairs = order[start:start + n]
        start += n
        xs = x[token_of[start - n:start]]
        h = F.linear(xs, w13[e])
        act = F.silu(h[:, :inter]) * h[:, inter:]
        y = F.linear(act, w2[e]).float()
        out.index_add_(0, pairs // k, y * topk_w.reshape(-1)[pairs].unsqueeze(1))
    return out.to(x.dtype)


@dataclass
class Prepared:
    """A candidate with its weights prepared: run(x, topk_w, topk_ids) -> [c, H]."""

    run: Callable[[Tensor, Tensor, Tensor], Tensor]
    quantized: bool = False
    # the weights its output must match (w13, w2): the dequantized ones for a W4A16 kernel
    reference: tuple[Tensor, Tensor] | None = None
    note: str = ""


def reference_grouped_moe(w13: Tensor, w2: Tensor, group_size: int = 32) -> Prepared:
    return Prepared(lambda x, tw, ti: reference_moe(x, w13, w2, tw, ti),
                    note="reference, not vLLM's path")


def _vllm_ops():
    try:
        from k25exp import vllm_kernels

        vllm_kernels.load()  # vLLM's own pick of its kernel build (registers torch.ops._C)
        import vllm._custom_ops as ops
    except Exception as e:
        raise Unavailable(f"vLLM is not importable here ({type(e).__name__}: {e})") from None
    return ops


def vllm_fused_moe(w13: Tensor, w2: Tensor, group_size: int = 32) -> Prepared:
    ops = _vllm_ops()
    if w13.device.type == "cpu":
        if not hasattr(torch.ops._C, "cpu_fused_moe"):
            raise Unavailable("this vLLM build has no _C::cpu_fused_moe (not the CPU build)")
        if w13.dtype != torch.bfloat16 or w13.shape[1] % 64 or w13.shape[2] % 32:
            raise Unavailable(f"cpu_fused_moe needs bf16 weights with 2I % 64 == 0 and "
                              f"H % 32 == 0; got {tuple(w13.shape)} {w13.dtype}")
        isa = "amx" if torch.cpu._is_amx_tile_supported() else "vec"
        p13, p2 = ops.cpu_prepack_moe_weight(w13, isa), ops.cpu_prepack_moe_weight(w2, isa)

        def cpu(x: Tensor, tw: Tensor, ti: Tensor) -> Tensor:
            out = torch.empty_like(x)
            ops.cpu_fused_moe(out, x, p13, p2, None, None, tw, ti, "silu", isa)
            return out

        return Prepared(cpu, note=f"vLLM _C::cpu_fused_moe, isa {isa}")
    from vllm.model_executor.layers.fused_moe import fused_experts

    return Prepared(lambda x, tw, ti: fused_experts(x, w13, w2, tw, ti),
                    note="vLLM fused_experts (Triton), bf16 weights")


def vllm_marlin_moe(w13: Tensor, w2: Tensor, group_size: int = 32) -> Prepared:
    """vLLM's Marlin W4A16 MoE on the INT4 quantization of w13 / w2 (see the module doc)."""
    if w13.device.type != "cuda":
        raise Unavailable(f"Marlin MoE needs CUDA; the weights are on {w13.device}")
    ops = _vllm_ops()
    try:
        from vllm.model_executor.layers.quantization.utils import marlin_utils as mu
        from vllm.scalar_type import scalar_types
        try:  # its home since vLLM 0.2x's fused_moe/experts split
            from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
        except ImportError:
            from vllm.model_executor.layers.fused_moe.fused_marlin_moe import fused_marlin_moe
    except Exception as e:
        raise Unavailable(f"vLLM's Marlin MoE is not importable ({type(e).__name__}: {e})") from None
    e_, n13, h = w13.shape
    inter = w2.shape[2]
    if inter % 64 or h % 128 or h % group_size or inter % group_size:
        raise Unavailable(f"Marlin MoE tiles need I % 64 == 0 and H % 128 == 0 (and both "
                          f"multiples of group {group_size}); got I={inter}, H={h}")
    q13, s13, d13 = _quantize_experts(w13, group_size)
    q2, s2, d2 = _quantize_experts(w2, group_size)
    empty = torch.empty((e_, 0), dtype=torch.int32, device=w13.device)
    # GPTQ layout [E, K/8, N] (uint4b8: q + 8), then vLLM's own repack and scale permutation
    m13 = ops.gptq_marlin_moe_repack(_gptq_pack_experts(q13), empty, h, n13, 4)
    m2 = ops.gptq_marlin_moe_repack(_gptq_pack_experts(q2), empty, inter, h, 4)
    ms13 = mu.marlin_moe_permute_scales(s=s13.transpose(1, 2).contiguous(), size_k=h, size_n=n13,
                                        group_size=group_size)
    ms2 = mu.marlin_moe_permute_scales(s=s2.transpose(1, 2).contiguous(), size_k=inter, size_n=h,
                                       group_size=group_size)
    workspace = mu.marlin_make_workspace_new(w13.device, 4)
    qtype = scalar_types.uint4b8.id

    def run(x: Tensor, tw: Tensor, ti: Tensor) -> Tensor:
        return fused_marlin_moe(hidden_states=x, w1=m13, w2=m2, bias1=None, bias2=None,
                                w1_scale=ms13, w2_scale=ms2, topk_weights=tw, topk_ids=ti,
                                quant_type_id=qtype, global_num_experts=e_, workspace=workspace)

    return Prepared(run, quantized=True, reference=(d13, d2),
                    note=f"vLLM fused_marlin_moe, INT4 symmetric group {group_size} (uint4b8)")


def _quantize_experts(w: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per expert [E, N, K]: int4 codes [E, N, K], bf16 scales [E, N, K/g], dequantized bf16."""
    from k25exp.gemm.quant import dequantize, quantize_w4a16

    e_, n, k = w.shape
    qw = quantize_w4a16(w.reshape(e_ * n, k), group_size)  # groups run along K within a row
    return (qw.q.reshape(e_, n, k), qw.scales.reshape(e_, n, k // group_size),
            dequantize(qw).reshape(e_, n, k))


def _gptq_pack_experts(q: Tensor) -> Tensor:
    """int4 codes [E, N, K] (signed) -> int32 [E, K/8, N] in GPTQ order, stored as q + 8."""
    from k25exp.gemm.kernels import gptq_pack

    return torch.stack([gptq_pack(q[i].to(torch.int32) + 8) for i in range(q.shape[0])])


CANDIDATES = {"vllm_fused_moe": vllm_fused_moe, "vllm_marlin_moe": vllm_marlin_moe,
              "reference_grouped_moe": reference_grouped_moe}
