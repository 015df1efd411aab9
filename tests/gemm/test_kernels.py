from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from k25exp.gemm.kernels import (
    DEFAULT_RTOL, KernelUnavailable, check_correct, marlin, torch_bf16, torch_int4, w4a16_reference,
)
from k25exp.gemm.quant import QuantizedWeight, dequantize, packed_bytes, quantize_w4a16, random_weight

CUDA = torch.cuda.is_available()


def activations(m: int, k: int, seed: int = 11, device: str = "cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=gen).to(torch.bfloat16).to(device)


def every_code_weight(n: int, k: int, group_size: int) -> QuantizedWeight:
    """A QuantizedWeight that uses every int4 code -8..7 and distinct scales per group."""
    q = (torch.arange(n * k).reshape(n, k) * 7 % 16 - 8).to(torch.int8)
    gen = torch.Generator().manual_seed(5)
    scales = (torch.rand(n, k // group_size, generator=gen) * 0.01 + 1e-3).to(torch.bfloat16)
    return QuantizedWeight(q, scales, group_size)


@pytest.mark.parametrize("n,k,group_size,m", [
    (64, 256, 32, 1), (64, 256, 128, 16), (512, 7168, 32, 1), (512, 7168, 32, 16),
])
def test_torch_int4_cpu_matches_reference(n, k, group_size, m):
    w = random_weight(n, k, seed=1)
    qw = quantize_w4a16(w, group_size)
    x = activations(m, k)
    y = torch_int4(group_size=group_size).prepare(w, qw)(x)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    ok, err = check_correct(y, w4a16_reference().prepare(w, qw)(x))
    assert ok, err
    assert err < DEFAULT_RTOL / 2


def test_torch_int4_cpu_weight_is_exactly_dequantize():
    # Multiplying by the identity reads the kernel's weight back: the mapping
    # u = q + 8, zero = 0 reproduces q * scale bit for bit, every code -8..7 included.
    qw = every_code_weight(32, 256, 32)
    assert set(qw.q.unique().tolist()) == set(range(-8, 8))
    fn = torch_int4(group_size=32).prepare(None, qw)
    w_seen = fn(torch.eye(256, dtype=torch.bfloat16)).t()
    assert torch.equal(w_seen, dequantize(qw))


def test_bf16_and_reference_kernels():
    w = random_weight(48, 96, seed=2)
    qw = quantize_w4a16(w, 32)
    x = activations(3, 96)
    assert torch.equal(torch_bf16().prepare(w, None)(x), F.linear(x, w))
    assert torch.equal(w4a16_reference().prepare(None, qw)(x), F.linear(x, dequantize(qw)))
    with pytest.raises(ValueError, match="QuantizedWeight"):
        w4a16_reference().prepare(w, None)


def test_kernel_attributes_and_weight_bytes():
    n, k = 4096, 7168
    assert (torch_bf16().name, torch_bf16().quantized) == ("torch_bf16", False)
    assert torch_bf16().weight_bytes(n, k) == n * k * 2
    assert w4a16_reference().quantized and w4a16_reference().weight_bytes(n, k) == n * k * 2
    # torch's format carries a bf16 zero beside every bf16 scale.
    assert torch_int4().weight_bytes(n, k) == n * k // 2 + n * (k // 32) * 4
    assert marlin().weight_bytes(n, k) == packed_bytes(n, k, 32)
    assert torch_int4().quantized and marlin().quantized


def test_torch_int4_unavailable_shapes():
    w = random_weight(24, 256, seed=1)
    with pytest.raises(KernelUnavailable, match="N=24"):
        torch_int4().prepare(w, quantize_w4a16(w, 32))
    w = random_weight(32, 256, seed=1)
    with pytest.raises(KernelUnavailable, match="group_size 16"):
        torch_int4(group_size=16).prepare(w, quantize_w4a16(w, 16))
    with pytest.raises(ValueError, match="group_size=128"):
        torch_int4(group_size=128).prepare(w, quantize_w4a16(w, 32))


def test_marlin_unavailable_on_cpu():
    w = random_weight(64, 256, seed=1)
    with pytest.raises(KernelUnavailable, match="vLLM with CUDA is not importable: .+"):
        marlin().prepare(w, quantize_w4a16(w, 32))


@dataclass(frozen=True)
class WrongKernel:
    """Deliberately broken W4A16 kernels, to prove check_correct catches them."""
    how: str
    name: str = "wrong"
    quantized: bool = True

    def prepare(self, w_bf16, qw):
        w = dequantize(qw)
        if self.how == "scaled":
            return lambda x: F.linear(x, w) * 1.05
        if self.how == "transposed":
            return lambda x: F.linear(x, w.t().contiguous())
        if self.how == "unquantized":  # the bf16 weight instead of the int4 one
            return lambda x: F.linear(x, w_bf16)
        if self.how == "group_shifted":  # scales applied to the neighbouring group
            return lambda x: F.linear(x, dequantize(QuantizedWeight(qw.q, qw.scales.roll(1, dims=1), qw.group_size)))
        raise ValueError(self.how)

    def weight_bytes(self, n, k):
        return 0


@pytest.mark.parametrize("how", ["scaled", "transposed", "unquantized", "group_shifted"])
def test_wrong_kernels_fail_check_correct(how):
    w = random_weight(256, 256, seed=4)
    qw = quantize_w4a16(w, 32)
    x = activations(4, 256)
    ok, err = check_correct(WrongKernel(how).prepare(w, qw)(x), w4a16_reference().prepare(w, qw)(x))
    assert not ok and err > 2 * DEFAULT_RTOL


def test_check_correct_definition():
    y_ref = torch.tensor([[1.0, -2.0]])
    ok, err = check_correct(torch.tensor([[1.1, -2.0]]), y_ref)
    assert err == pytest.approx(0.1 / 2) and not ok
    assert check_correct(torch.tensor([[1.01, -2.0]]), y_ref) == (True, pytest.approx(0.005))
    assert check_correct(torch.zeros(2, 1), y_ref) == (False, float("inf"))
    assert check_correct(torch.tensor([[float("nan"), -2.0]]), y_ref)[0] is False
    assert check_correct(torch.zeros(1, 2), torch.zeros(1, 2)) == (True, 0.0)


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 16, 64])
def test_torch_int4_cuda_matches_reference(m):
    w = random_weight(512, 7168, seed=1, device="cuda")
    qw = quantize_w4a16(w, 32)
    x = activations(m, 7168, device="cuda")
    ok, err = check_correct(torch_int4().prepare(w, qw)(x), w4a16_reference().prepare(w, qw)(x))
    assert ok, err


@pytest.mark.cuda
def test_torch_int4_cuda_weight_matches_dequantize():
    qw = every_code_weight(64, 256, 32).to("cuda")
    w_seen = torch_int4().prepare(None, qw)(torch.eye(256, dtype=torch.bfloat16, device="cuda")).t()
    ok, err = check_correct(w_seen, dequantize(qw), rtol=1e-2)
    assert ok, err


@pytest.mark.cuda
def test_marlin_cuda_matches_reference_or_is_unavailable():
    w = random_weight(512, 7168, seed=1, device="cuda")
    qw = quantize_w4a16(w, 32)
    try:
        fn = marlin().prepare(w, qw)
    except KernelUnavailable as e:  # vLLM's CUDA build is optional: say why, don't skip
        pytest.xfail(str(e))
    x = activations(16, 7168, device="cuda")
    ok, err = check_correct(fn(x), w4a16_reference().prepare(w, qw)(x))
    assert ok, err


@pytest.mark.vllm
def test_vllms_own_cpu_linear_dispatch_matches_fp32():
    pytest.importorskip("vllm")
    from k25exp.gemm.kernels import check_correct, vllm_linear

    # a router-sized weight (vLLM picks weight_packed_linear) and a projection (oneDNN)
    for n, k in ((16, 512), (2048, 512)):
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
        fn = vllm_linear().prepare(w)
        for m in (1, 7):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
            ok, err = check_correct(fn(x), x.float() @ w.float().T, 2e-2)
            assert ok, (n, k, m, err)


# GateLinear's DSV3 lists as vLLM 0.26 writes them (experts, hidden sizes, unsupported pairs)
DSV3 = ([256, 384], [7168, 6144], {(6144, 384)})


@pytest.mark.parametrize("n,k,m,cap,want", [
    (384, 7168, 1, (9, 0), "dsv3_router_gemm"),    # Kimi's gate at batch 1 on an H100/H200
    (384, 7168, 16, (9, 0), "dsv3_router_gemm"),
    (384, 7168, 17, (9, 0), "F.linear"),           # past the kernel's 16 rows
    (384, 7168, 9, (10, 0), "F.linear"),           # SM 10.x stops at 8
    (384, 7168, 8, (10, 0), "dsv3_router_gemm"),
    (384, 6144, 1, (9, 0), "F.linear"),            # the one pair the kernel is not built for
    (256, 6144, 1, (9, 0), "dsv3_router_gemm"),
    (384, 7168, 1, (8, 0), "F.linear"),            # an A100 has neither kernel
    (384, 7168, 1, (12, 0), "F.linear"),           # nor does SM 12.x
    (2112, 7168, 1, (9, 0), "dsv3_fused_a_gemm"),  # fused_qkv_a_proj
    (2112, 7168, 16, (10, 3), "dsv3_fused_a_gemm"),
    (2112, 7168, 32, (9, 0), "F.linear"),
    (2112, 4096, 1, (9, 0), "F.linear"),           # not the DeepSeek-V3 dims
    (4096, 7168, 1, (9, 0), "F.linear"),
])
def test_cuda_path_is_vllms_dispatch(n, k, m, cap, want):
    from k25exp.gemm.kernels import cuda_path

    assert cuda_path(n, k, m, cap, DSV3) == want


def test_cuda_path_without_the_router_kernel_is_linear_for_the_gate():
    from k25exp.gemm.kernels import cuda_path

    assert cuda_path(384, 7168, 1, (9, 0), None) == "F.linear"
    assert cuda_path(2112, 7168, 1, (9, 0), None) == "dsv3_fused_a_gemm"


def test_paths_groups_runs_of_m():
    from k25exp.runners.gemm import paths

    got = paths(lambda m: "a" if m <= 16 else "b", [32, 1, 2, 4, 8, 16, 256])
    assert got == "a at M 1–16; b at M 32–256"
    assert paths(lambda m: "a", [4]) == "a at M 4"
    assert paths(lambda m: "b" if m == 2 else "a", [1, 2, 4]) == "a at M 1; b at M 2; a at M 4"


@pytest.mark.cuda
@pytest.mark.parametrize("n,k", [(384, 7168), (2112, 7168)])
def test_vllm_linear_cuda_runs_vllms_small_m_kernels(n, k):
    """The gate's and fused_qkv_a_proj's own kernels are what vllm_linear runs at M <= 16 on
    SM 9.0 (cuBLAS above), and they agree with fp32 (the router's output is fp32)."""
    from torch.profiler import ProfilerActivity, profile

    from k25exp.gemm.kernels import cuda_path, vllm_linear

    w = random_weight(n, k, seed=3, device="cuda")
    try:
        fn = vllm_linear().prepare(w)
    except KernelUnavailable as e:  # vLLM's CUDA build is optional: say why
        pytest.xfail(str(e))
    cap = torch.cuda.get_device_capability()
    for m in (1, 16, 32):
        x = activations(m, k, device="cuda")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            y = fn(x)
            torch.cuda.synchronize()
        names = " ".join(e.name for e in prof.events())
        ok, err = check_correct(y, x.float() @ w.float().T)
        assert ok, (n, k, m, err)
        want = cuda_path(n, k, m, cap, DSV3)
        own = {"dsv3_router_gemm": "router_gemm", "dsv3_fused_a_gemm": "fused_a_gemm"}
        for path, kernel_name in own.items():
            assert (kernel_name in names) == (want == path), (m, want, names[:400])
