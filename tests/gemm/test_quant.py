from __future__ import annotations

import pytest
import torch

from k25exp.gemm.quant import QuantizedWeight, dequantize, packed_bytes, quantize_w4a16, random_weight


@pytest.mark.parametrize("group_size", [32, 128])
def test_round_trip_within_half_a_scale(group_size):
    w = random_weight(64, 512, seed=3)
    qw = quantize_w4a16(w, group_size)
    assert qw.q.dtype == torch.int8 and qw.q.shape == (64, 512)
    assert qw.scales.dtype == torch.bfloat16 and qw.scales.shape == (64, 512 // group_size)
    assert int(qw.q.min()) >= -8 and int(qw.q.max()) <= 7
    assert (qw.scales.float() > 0).all()
    # Exact arithmetic (fp32 holds q * scale exactly): |q * s - w| <= s / 2 for every element.
    s = qw.scales.float().repeat_interleave(group_size, dim=1)
    err = (qw.q.float() * s - w.float()).abs()
    assert (err <= s / 2 * (1 + 1e-6)).all()
    # dequantize() is that value rounded once to bf16.
    assert torch.equal(dequantize(qw), (qw.q.float() * s).to(torch.bfloat16))
    # The top of each group's range is used (absmax maps to +-7).
    assert int(qw.q.abs().max()) == 7


def test_zero_group_is_guarded():
    w = random_weight(16, 64, seed=0)
    w[:, :32] = 0
    qw = quantize_w4a16(w, 32)
    assert torch.isfinite(qw.scales.float()).all() and (qw.scales.float() > 0).all()
    assert (qw.q[:, :32] == 0).all()
    assert (dequantize(qw)[:, :32] == 0).all()


def test_quantize_rejects_bad_shapes():
    with pytest.raises(ValueError, match="divisible"):
        quantize_w4a16(torch.zeros(4, 48), 32)
    with pytest.raises(ValueError, match="2-D"):
        quantize_w4a16(torch.zeros(4, 4, 4), 2)


def test_random_weight_is_deterministic():
    a = random_weight(256, 256, seed=7)
    assert a.dtype == torch.bfloat16 and a.shape == (256, 256)
    assert torch.equal(a, random_weight(256, 256, seed=7))
    assert not torch.equal(a, random_weight(256, 256, seed=8))
    assert a.float().std().item() == pytest.approx(0.02, rel=0.05)
    assert random_weight(4, 4, seed=1, dtype=torch.float32).dtype == torch.float32


def test_quantized_weight_properties():
    qw = quantize_w4a16(random_weight(32, 64, seed=1), 32)
    assert (qw.n, qw.k) == (32, 64)
    assert isinstance(qw.to("cpu"), QuantizedWeight)


def test_packed_bytes():
    assert packed_bytes(16, 64, 32) == 16 * 32 + 16 * 2 * 2
    assert packed_bytes(16, 64, 32, scale_bytes=4) == 16 * 32 + 16 * 2 * 4
    # Kimi expert gate_up at group 32: 4.5 bits per weight, ~3.56x fewer bytes than bf16.
    b = packed_bytes(4096, 7168, 32)
    assert b == 4096 * 7168 // 2 + 4096 * 224 * 2 == 16_515_072
    assert 4096 * 7168 * 2 / b == pytest.approx(3.5556, abs=1e-4)
    with pytest.raises(ValueError):
        packed_bytes(16, 48, 32)
