"""GEMM implementations to compare, each made by a factory a config names by ``_target_``.

A kernel's ``prepare(w_bf16, qw)`` does the one-off work (packing, repacking) and returns
``fn(x) -> y`` with ``x`` bf16 [M, k] and ``y`` bf16 [M, n] = ``x @ W.T``; only ``fn`` is timed.
Weights are used on the device they are given on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from k25exp.gemm.quant import QuantizedWeight, dequantize, packed_bytes

GemmFn = Callable[[Tensor], Tensor]

# Tolerance of check_correct for bf16 outputs of int4 kernels against the dequantized
# reference, as max|y - y_ref| / max|y_ref|. Measured on CPU (torch 2.13, 2 threads, random
# N(0, 0.02) weights, N(0, 1) activations, group 32, M = 1 and 16): torch's int4 kernel gave
# 2.4e-3 to 5.0e-3 at [512|4096 x 7168], [7168 x 2048] and [64 x 256]; on an H200
# (torch 2.11, M = 1..64) 0 to 4.3e-3. That is one bf16 rounding of the output
# disagreeing by an ulp, which is up to 2^-7 = 7.8e-3 of max|y|.
# 2e-2 allows ~2.5 ulps (GPU kernels that split K or dequantize in bf16), while the errors
# it must catch are far above it: using the unquantized bf16 weight instead gives ~0.1, a
# 5 % scale error 5e-2, a wrong layout ~1.
DEFAULT_RTOL = 2e-2


class KernelUnavailable(Exception):
    """This kernel cannot run this shape on this device (the message says why)."""


class Kernel(Protocol):
    name: str
    quantized: bool  # consumes a QuantizedWeight

    def prepare(self, w_bf16: Tensor, qw: QuantizedWeight | None) -> GemmFn: ...

    def weight_bytes(self, n: int, k: int) -> int:
        """Bytes of weights (and their scales/zeros) one call must read."""
        ...


def check_correct(y: Tensor, y_ref: Tensor, rtol: float = DEFAULT_RTOL) -> tuple[bool, float]:
    """Compare a kernel's output to the reference.

    max_rel_err = max|y - y_ref| / max(max|y_ref|, tiny), in fp32: the worst element error
    relative to the output's scale (a per-element relative error explodes where y_ref ~ 0).
    ok = the shapes match, y is finite and max_rel_err <= rtol.
    """
    if y.shape != y_ref.shape:
        return False, float("inf")
    y, y_ref = y.float(), y_ref.float()
    if not torch.isfinite(y).all():
        return False, float("inf")
    denom = max(y_ref.abs().max().item(), torch.finfo(torch.float32).tiny)
    err = (y - y_ref).abs().max().item() / denom
    return err <= rtol, err


def _need_qw(name: str, qw: QuantizedWeight | None, group_size: int | None = None) -> QuantizedWeight:
    if qw is None:
        raise ValueError(f"{name} needs a QuantizedWeight")
    if group_size is not None and qw.group_size != group_size:
        raise ValueError(f"{name} was made for group_size={group_size}, the weight has {qw.group_size}")
    return qw


@dataclass(frozen=True)
class _TorchBF16:
    name: str = "torch_bf16"
    quantized: bool = False

    def prepare(self, w_bf16: Tensor, qw: QuantizedWeight | None = None) -> GemmFn:
        w = w_bf16.to(torch.bfloat16).contiguous()
        return lambda x: F.linear(x, w)

    def weight_bytes(self, n: int, k: int) -> int:
        return n * k * 2


@dataclass(frozen=True)
class _W4A16Reference:
    """Correctness oracle: dequantize once, then a bf16 GEMM. It reads bf16 weights, so its
    timing is the bf16 GEMM's, not a W4A16 kernel's."""

    name: str = "w4a16_reference"
    quantized: bool = True

    def prepare(self, w_bf16: Tensor | None, qw: QuantizedWeight | None) -> GemmFn:
        w = dequantize(_need_qw(self.name, qw)).contiguous()
        return lambda x: F.linear(x, w)

    def weight_bytes(self, n: int, k: int) -> int:
        return n * k * 2


# PyTorch's tinygemm-derived int4 kernels (CUDA: sm80+; CPU: its own packing).
# Their dequantization is  w = (u - 8) * scale + zero  with u the unsigned 4-bit value and
# scales_and_zeros of shape [K/g, N, 2] ([..., 0] = scale, [..., 1] = zero) in the
# activation dtype. Our symmetric  w = q * scale  is therefore  u = q + 8, zero = 0: exact.
# Packing differs by device: CPU converts an int32 [N, K] of u; CUDA converts a uint8
# [N, K/2] with the even-K value in the high nibble (as torch's own tests pack it).
# Both checked against dequantize() in tests/gemm (CPU: bit-exact; CUDA: on an H200).
_TORCH_INT4_GROUPS = (32, 64, 128, 256)


@dataclass(frozen=True)
class _TorchInt4:
    inner_k_tiles: int = 8
    group_size: int = 32
    name: str = "torch_int4"
    quantized: bool = True

    def _check(self, n: int, k: int, device: torch.device) -> None:
        why = []
        if self.group_size not in _TORCH_INT4_GROUPS:
            why.append(f"group_size {self.group_size} not in {_TORCH_INT4_GROUPS}")
        if self.inner_k_tiles not in (2, 4, 8):
            why.append(f"inner_k_tiles {self.inner_k_tiles} not in (2, 4, 8)")
        if device.type == "cpu":
            if n % 16:
                why.append(f"N={n} is not a multiple of 16 (CPU packing)")
        elif device.type == "cuda":
            if torch.cuda.get_device_capability(device) < (8, 0):
                why.append("CUDA int4 kernel needs compute capability >= 8.0")
            if n % 8:
                why.append(f"N={n} is not a multiple of 8")
            if k % (self.inner_k_tiles * 16):
                why.append(f"K={k} is not a multiple of inner_k_tiles*16={self.inner_k_tiles * 16}")
        else:
            why.append(f"no torch int4 kernel for device type {device.type!r}")
        if why:
            raise KernelUnavailable(f"{self.name} [{n} x {k}] on {device}: " + "; ".join(why))

    def prepare(self, w_bf16: Tensor | None, qw: QuantizedWeight | None) -> GemmFn:
        qw = _need_qw(self.name, qw, self.group_size)
        n, k = qw.q.shape
        device = qw.q.device
        self._check(n, k, device)
        g = self.group_size
        u = qw.q.to(torch.int32) + 8  # [n, k] in [0, 15]
        sz = torch.stack([qw.scales.t(), torch.zeros_like(qw.scales.t())], dim=-1)
        sz = sz.to(torch.bfloat16).contiguous()  # [k/g, n, 2]
        if device.type == "cpu":
            packed = torch._convert_weight_to_int4pack_for_cpu(u.contiguous(), self.inner_k_tiles)
            return lambda x: torch._weight_int4pack_mm_for_cpu(x, packed, g, sz)
        u8 = ((u[:, ::2] << 4) | u[:, 1::2]).to(torch.uint8).contiguous()
        packed = torch._convert_weight_to_int4pack(u8, self.inner_k_tiles)
        return lambda x: torch._weight_int4pack_mm(x, packed, g, sz)

    def weight_bytes(self, n: int, k: int) -> int:
        # 4-bit values plus a bf16 scale AND a bf16 zero per group: its format reads both.
        return packed_bytes(n, k, self.group_size, scale_bytes=4)


# vLLM's Marlin W4A16 GEMM, prepared the way vLLM's MarlinLinearKernel prepares a
# compressed-tensors pack-quantized layer: GPTQ-order int32 [K/8, N] (8 values along K per
# word, lowest bits first, u = q + 8, type uint4b8), gptq_marlin_repack, permuted [K/g, N]
# scales, empty g_idx/zero points, then apply_gptq_marlin_linear (keyword arguments only:
# the positional order of ops.gptq_marlin_gemm has changed between vLLM releases).
# Not yet run anywhere: written from vLLM's source (main, 2026); no vLLM with CUDA was at hand.
_MARLIN_GROUPS = (32, 64, 128)


def gptq_pack(u: Tensor) -> Tensor:
    """[n, k] unsigned int4 -> int32 [k/8, n] in GPTQ order."""
    n, k = u.shape
    if k % 8:
        raise KernelUnavailable(f"marlin: K={k} is not a multiple of 8")
    ut = u.t().to(torch.int64).reshape(k // 8, 8, n)
    shifts = (torch.arange(8, device=u.device, dtype=torch.int64) * 4).view(1, 8, 1)
    words = (ut << shifts).sum(dim=1)  # < 2^32
    words = torch.where(words >= 2**31, words - 2**32, words)  # reinterpret as int32
    return words.to(torch.int32).contiguous()


@dataclass(frozen=True)
class _Marlin:
    group_size: int = 32
    name: str = "marlin"
    quantized: bool = True

    def prepare(self, w_bf16: Tensor | None, qw: QuantizedWeight | None) -> GemmFn:
        qw = _need_qw(self.name, qw, self.group_size)
        n, k = qw.q.shape
        device = qw.q.device
        # Check CUDA before importing vLLM: importing a CPU build of vLLM is slow and useless here.
        if device.type != "cuda" or not torch.cuda.is_available():
            raise KernelUnavailable(
                f"vLLM with CUDA is not importable: the weight is on {device} "
                f"(torch.cuda.is_available()={torch.cuda.is_available()})"
            )
        try:
            from vllm import _custom_ops as ops
            from vllm.model_executor.layers.quantization.utils import marlin_utils as mu
            from vllm.scalar_type import scalar_types
        except Exception as e:  # ImportError, or a vLLM build without its CUDA ops
            raise KernelUnavailable(f"vLLM with CUDA is not importable: {type(e).__name__}: {e}") from e
        why = []
        if self.group_size not in _MARLIN_GROUPS:
            why.append(f"group_size {self.group_size} not in {_MARLIN_GROUPS}")
        if n % 64:
            why.append(f"N={n} is not a multiple of 64")
        if k % 128:
            why.append(f"K={k} is not a multiple of 128")
        if torch.cuda.get_device_capability(device) < (8, 0):
            why.append("Marlin needs compute capability >= 8.0")
        if why:
            raise KernelUnavailable(f"marlin [{n} x {k}] on {device}: " + "; ".join(why))

        empty = torch.empty(0, dtype=torch.int, device=device)
        q_marlin = ops.gptq_marlin_repack(
            b_q_weight=gptq_pack(qw.q.to(torch.int32) + 8), perm=empty, size_k=k, size_n=n, num_bits=4
        )
        s_marlin = mu.marlin_permute_scales(
            qw.scales.t().contiguous().to(torch.bfloat16), size_k=k, size_n=n, group_size=self.group_size
        )
        if hasattr(mu, "marlin_make_workspace_new"):
            workspace = mu.marlin_make_workspace_new(device)
        else:  # older vLLM
            workspace = mu.marlin_make_workspace(n, device)

        def fn(x: Tensor) -> Tensor:
            return mu.apply_gptq_marlin_linear(
                input=x, weight=q_marlin, weight_scale=s_marlin, weight_zp=empty, g_idx=empty,
                g_idx_sort_indices=empty, workspace=workspace, wtype=scalar_types.uint4b8,
                output_size_per_partition=n, input_size_per_partition=k, is_k_full=True,
            )

        return fn

    def weight_bytes(self, n: int, k: int) -> int:
        return packed_bytes(n, k, self.group_size, scale_bytes=2)


# vLLM 0.26's CUDA paths for the bf16 GEMMs of a DeepseekV3 model (Kimi included): F.linear
# (cuBLAS, what torch_bf16 times) except two layers it gives small-M kernels of their own,
# both chosen by the weight's dims and the GPU, as vLLM chooses them:
#  - the MoE gate (GateLinear, fused_moe/router/gate_linear.py): dsv3_router_gemm at
#    M <= 16 on SM 9.0 (8 on SM 10.x) when (hidden, experts) is in GateLinear's DSV3 lists; its
#    output is fp32 (Kimi's config sets no moe_router_dtype, so out_dtype is None and the op's
#    torch.empty takes the default dtype); above that F.linear. (Its cuteDSL tier needs
#    out_dtype fp32 and the CUTLASS DSL; its cuBLAS fp32-out tier needs out_dtype fp32 too.)
#  - fused_qkv_a_proj (DeepSeekV2FusedQkvAProj, models/deepseek_v2.py): dsv3_fused_a_gemm at
#    0 < M <= 16 for a [2112 x 7168] weight on SM 9.0 / 10.x; above that F.linear.
# On an H200 (vLLM 0.26) the server's trace showed router_gemm_kernel_float_output (3.35 us)
# and fused_a_gemm_kernel<1, 2112, 7168> (9.74 us) at M = 1 where cuBLAS took 7.28 / 12.86.
FUSED_A_SHAPE = (2112, 7168)  # [n x k] of DeepSeekV2FusedQkvAProj's min-latency kernel
SMALL_M = 16  # both kernels' largest M on SM 9.0


def cuda_path(n: int, k: int, m: int, capability: tuple[int, int],
              gate_dims: tuple[list[int], list[int], set] | None) -> str:
    """Which kernel vLLM's server runs for a bf16 [n x k] weight at M rows on a GPU of this
    compute capability: "dsv3_router_gemm", "dsv3_fused_a_gemm" or "F.linear".

    gate_dims = GateLinear's (DSV3_SUPPORTED_NUM_EXPERTS, DSV3_SUPPORTED_HIDDEN_SIZES,
    DSV3_UNSUPPORTED_SHAPES) as the installed vLLM defines them; None where it has none (a vLLM
    without the DSV3 router kernel)."""
    hopper, blackwell = capability == (9, 0), capability[0] == 10
    if not (hopper or blackwell) or m <= 0:
        return "F.linear"
    if gate_dims is not None:
        experts, hiddens, unsupported = gate_dims
        if n in experts and k in hiddens and (k, n) not in unsupported \
                and m <= (SMALL_M if hopper else 8):
            return "dsv3_router_gemm"
    if (n, k) == FUSED_A_SHAPE and m <= SMALL_M:
        return "dsv3_fused_a_gemm"
    return "F.linear"


@dataclass(frozen=True)
class _VllmLinear:
    """vLLM's own dispatch of an unquantized linear layer (the path its server runs).

    CPU build: `dispatch_cpu_unquantized_gemm` picks the sgl-kernel weight_packed_linear for
    small weights or a oneDNN matmul handle, on the layer's weight as vLLM loads it.
    CUDA build: F.linear, except the MoE gate and fused_qkv_a_proj at small M, which run
    vLLM's own kernels (cuda_path says which; `path` names it per row of the results)."""

    name: str = "vllm_linear"
    quantized: bool = False

    def prepare(self, w_bf16: Tensor, qw: QuantizedWeight | None = None) -> GemmFn:
        if w_bf16.device.type == "cuda":
            return self._prepare_cuda(w_bf16)
        try:
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        except Exception as e:
            raise KernelUnavailable(f"vLLM is not importable here ({type(e).__name__}: {e})") from None
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(w_bf16.to(torch.bfloat16).contiguous(), requires_grad=False)
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        return lambda x: layer.cpu_linear(x, layer.weight, None)

    def _prepare_cuda(self, w_bf16: Tensor) -> GemmFn:
        ops, gate_dims = _vllm_cuda_ops()
        w = w_bf16.to(torch.bfloat16).contiguous()
        n, k = w.shape
        cap = torch.cuda.get_device_capability(w.device)

        def fn(x: Tensor) -> Tensor:
            # chosen per call on the host, as vLLM's custom ops choose by num_tokens
            path = cuda_path(n, k, x.shape[0], cap, gate_dims)
            if path == "dsv3_router_gemm":
                return ops.dsv3_router_gemm(hidden_states=x, router_weight=w,
                                            output_dtype=torch.float32)
            if path == "dsv3_fused_a_gemm":
                y = torch.empty(x.shape[0], n, dtype=torch.bfloat16, device=x.device)
                ops.dsv3_fused_a_gemm(y, x, w.T)
                return y
            return F.linear(x, w)

        return fn

    def path(self, n: int, k: int, m: int, device: torch.device) -> str:
        """The kernel this candidate runs for [n x k] at M on device (for the results' note)."""
        if device.type != "cuda":
            return "vLLM's CPU dispatch"
        return cuda_path(n, k, m, torch.cuda.get_device_capability(device), _vllm_cuda_ops()[1])

    def weight_bytes(self, n: int, k: int) -> int:
        return n * k * 2


def _vllm_cuda_ops():
    """vLLM's CUDA ops module and GateLinear's DSV3 dims (None when this vLLM has none)."""
    try:
        from vllm import _custom_ops as ops
        from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
    except Exception as e:  # no vLLM, or a build without its CUDA ops
        raise KernelUnavailable(f"vLLM with CUDA is not importable: {type(e).__name__}: {e}") from None
    dims = None
    if hasattr(ops, "dsv3_router_gemm") and hasattr(GateLinear, "DSV3_SUPPORTED_NUM_EXPERTS"):
        dims = (list(GateLinear.DSV3_SUPPORTED_NUM_EXPERTS),
                list(GateLinear.DSV3_SUPPORTED_HIDDEN_SIZES),
                set(getattr(GateLinear, "DSV3_UNSUPPORTED_SHAPES", ())))
    if not hasattr(ops, "dsv3_fused_a_gemm"):
        raise KernelUnavailable("this vLLM has no dsv3_fused_a_gemm: vllm_linear mirrors vLLM "
                                "0.26's CUDA dispatch; time torch_bf16 (F.linear) instead")
    return ops, dims


def vllm_linear() -> Kernel:
    """vLLM's dispatch of an unquantized linear: on CPU weight_packed_linear or oneDNN; on
    CUDA F.linear, or vLLM's small-M kernels for the MoE gate and fused_qkv_a_proj."""
    return _VllmLinear()


def torch_bf16() -> Kernel:
    """BF16 baseline: ``F.linear`` (cuBLAS on CUDA, oneDNN/MKL on CPU)."""
    return _TorchBF16()


def w4a16_reference() -> Kernel:
    """The oracle: dequantize to bf16 once at prepare, then ``F.linear``."""
    return _W4A16Reference()


def torch_int4(inner_k_tiles: int = 8, group_size: int = 32) -> Kernel:
    """PyTorch's own int4 weight-only GEMM (``_weight_int4pack_mm`` / ``..._for_cpu``)."""
    return _TorchInt4(inner_k_tiles=inner_k_tiles, group_size=group_size)


def marlin(group_size: int = 32) -> Kernel:
    """vLLM's Marlin W4A16 GEMM (needs vLLM with CUDA; KernelUnavailable otherwise)."""
    return _Marlin(group_size=group_size)
