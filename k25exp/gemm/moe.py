"""The routed experts of one MoE layer at a batch of c tokens, run as one call.

vLLM never runs experts one by one: its FusedMoE layer hands all c × top_k (token, expert)
pairs to one fused kernel. The candidates here time that call:

* `vllm_fused_moe`: vLLM's own fused MoE op, the one its server runs. CPU build:
  `_C::cpu_fused_moe` on weights prepacked by `_C::prepack_moe_weight`, isa `amx` where the
  CPU has AMX tiles, else `vec` (as vLLM's CPUUnquantizedExperts picks). CUDA: vLLM's
  `fused_experts` (bf16). Unavailable without vLLM (the reason is logged).
* `reference_grouped_moe`: plain torch, named as a reference: tokens sorted by expert, two
  matmuls and SiLU-and-mul per active expert, weighted scatter-add. Not vLLM's path.

Weights: w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I] with I the TP shard of
moe_intermediate_size, as vLLM's FusedMoE stores them. Routing: deterministic random scores
through sigmoid, top-k, weights renormalised (Kimi's sigmoid top-k without the correction
bias, which changes which experts, not how many).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

MoeFn = Callable[[Tensor], Tensor]


class Unavailable(RuntimeError):
    """The candidate cannot run here; the message says why."""


def route(c: int, n_experts: int, top_k: int, seed: int, device="cpu") -> tuple[Tensor, Tensor]:
    """(topk_weights float32 [c, k], topk_ids int32 [c, k]) for c tokens."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(c, n_experts, generator=g).sigmoid()
    w, ids = scores.topk(top_k, dim=-1)
    w = w / w.sum(-1, keepdim=True)
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


def reference_grouped_moe(w13: Tensor, w2: Tensor, topk_w: Tensor, topk_ids: Tensor) -> MoeFn:
    return lambda x: reference_moe(x, w13, w2, topk_w, topk_ids)


def vllm_fused_moe(w13: Tensor, w2: Tensor, topk_w: Tensor, topk_ids: Tensor) -> MoeFn:
    try:
        from k25exp import vllm_kernels

        vllm_kernels.load()  # vLLM's own pick of its kernel build (registers torch.ops._C)
        import vllm._custom_ops as ops
    except Exception as e:
        raise Unavailable(f"vLLM is not importable here ({type(e).__name__}: {e})") from None
    if w13.device.type == "cpu":
        if not hasattr(torch.ops._C, "cpu_fused_moe"):
            raise Unavailable("this vLLM build has no _C::cpu_fused_moe (not the CPU build)")
        if w13.dtype != torch.bfloat16 or w13.shape[1] % 64 or w13.shape[2] % 32:
            raise Unavailable(f"cpu_fused_moe needs bf16 weights with 2I % 64 == 0 and "
                              f"H % 32 == 0; got {tuple(w13.shape)} {w13.dtype}")
        isa = "amx" if torch.cpu._is_amx_tile_supported() else "vec"
        p13, p2 = ops.cpu_prepack_moe_weight(w13, isa), ops.cpu_prepack_moe_weight(w2, isa)

        def cpu(x: Tensor) -> Tensor:
            out = torch.empty_like(x)
            ops.cpu_fused_moe(out, x, p13, p2, None, None, topk_w, topk_ids, "silu", isa)
            return out

        cpu.isa = isa  # type: ignore[attr-defined]
        return cpu
    from vllm.model_executor.layers.fused_moe import fused_experts

    ids = topk_ids.long() if topk_ids.dtype != torch.int32 else topk_ids
    return lambda x: fused_experts(x, w13, w2, topk_w, ids)


CANDIDATES = {"vllm_fused_moe": vllm_fused_moe, "reference_grouped_moe": reference_grouped_moe}
