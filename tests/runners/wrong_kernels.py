"""Deliberately wrong GEMM kernels, for the correctness gate's tests (named by `_target_`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F


@dataclass(frozen=True)
class _Scaled:
    factor: float
    name: str = "scaled_bf16"
    quantized: bool = False

    def prepare(self, w, qw=None):
        return lambda x: F.linear(x, w) * self.factor

    def weight_bytes(self, n: int, k: int) -> int:
        return n * k * 2


def scaled_bf16(factor: float = 1.05):
    """F.linear with its output scaled: 5 % off, well above the gate's tolerance."""
    return _Scaled(factor)
