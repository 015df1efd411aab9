"""W4A16 weights: symmetric int4, one bf16 scale per group of ``group_size`` along K.

This is the scheme of compressed-tensors ``pack-quantized`` checkpoints (Kimi-K2 INT4 uses
group 32): ``w ~= q * scale`` with ``q`` a signed 4-bit integer and no zero point.

Scale choice: ``scale = absmax / 7`` per group, rounded to bf16, then
``q = clamp(round(w / scale), -8, 7)``. Every value then lands in [-7, 7] (the bf16 rounding
of the scale moves ``|w|/scale`` by < 0.3 %, never to 7.5), so the round-trip error is at
most ``scale / 2`` for every element. compressed-tensors divides by 7.5 instead and lets
clamping absorb the top value; that uses the -8 code but costs the clean bound. For
timing the two are the same bits; only the numerical oracle cares, and it uses ours.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

INT4_MIN, INT4_MAX = -8, 7
_QMAX = 7.0  # absmax maps to +-7 (see module docstring)


@dataclass(frozen=True)
class QuantizedWeight:
    q: Tensor  # int8 [n, k], values in [-8, 7]
    scales: Tensor  # bf16 [n, k // group_size]
    group_size: int

    @property
    def n(self) -> int:
        return self.q.shape[0]

    @property
    def k(self) -> int:
        return self.q.shape[1]

    def to(self, device: torch.device | str) -> QuantizedWeight:
        return QuantizedWeight(self.q.to(device), self.scales.to(device), self.group_size)


def _check_groups(k: int, group_size: int) -> None:
    if group_size < 1 or k % group_size:
        raise ValueError(f"K={k} is not divisible by group_size={group_size}")


def quantize_w4a16(w: Tensor, group_size: int) -> QuantizedWeight:
    """Quantize ``w`` ([n, k], any float dtype) to symmetric int4 with bf16 group scales."""
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight [n, k], got shape {tuple(w.shape)}")
    n, k = w.shape
    _check_groups(k, group_size)
    groups = w.float().reshape(n, k // group_size, group_size)
    absmax = groups.abs().amax(dim=-1)
    # An all-zero group would give scale 0 and 0/0 below; any positive scale quantizes it to 0.
    scales = torch.where(absmax > 0, absmax / _QMAX, torch.ones_like(absmax)).to(torch.bfloat16)
    # Quantize with the scale exactly as stored (bf16), so dequantize() inverts it.
    q = torch.round(groups / scales.float().unsqueeze(-1)).clamp_(INT4_MIN, INT4_MAX)
    return QuantizedWeight(q.reshape(n, k).to(torch.int8), scales, group_size)


def dequantize(qw: QuantizedWeight) -> Tensor:
    """``q * scale`` computed in fp32 (exact), rounded once to bf16 -> [n, k]."""
    n, k = qw.q.shape
    g = qw.group_size
    w = qw.q.float().reshape(n, k // g, g) * qw.scales.float().unsqueeze(-1)
    return w.reshape(n, k).to(torch.bfloat16)


def random_weight(
    n: int, k: int, seed: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
    std: float = 0.02,
) -> Tensor:
    """A deterministic N(0, std^2) weight [n, k] like a real init (std 0.02 as DeepseekV3's
    initializer_range). Drawn on the CPU with its own generator, so the values are the same
    whatever the device and whatever else used the global RNG."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    w = torch.randn(n, k, generator=gen, dtype=torch.float32).mul_(std)
    return w.to(dtype).to(device)


def packed_bytes(n: int, k: int, group_size: int, scale_bytes: int = 2) -> int:
    """Bytes of a packed W4A16 weight: 4 bits per value plus one scale per group."""
    _check_groups(k, group_size)
    if k % 2:
        raise ValueError(f"K={k} must be even to pack two int4 values per byte")
    return n * k // 2 + n * (k // group_size) * scale_bytes
