"""Which vLLM CPU kernel build a process gets, and the cap that makes an AVX-512 machine take
an AVX2-only one's path (its real use, in server and ranks, is in tests/runners)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from k25exp import vllm_kernels as vk
from k25exp.config.validate import ConfigError, to_typed
from k25exp.serving import server
from tests.conftest import compose_cfg, vllm_cpu_build

AVX2_ONLY = "processor : 0\nflags\t\t: fpu sse2 avx avx2 fma\n"  # an AMD EPYC without AVX-512
SPR = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"  # Sapphire Rapids: AMX tiles
ZEN4 = "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"  # AVX-512 + BF16, no AMX


def test_flags_and_levels_from_cpuinfo():
    assert vk.cpu_flags(AVX2_ONLY) == {"avx2": True, "avx512f": False, "avx512_bf16": False,
                                       "amx_tile": False, "amx_bf16": False}
    assert vk.native_level(vk.cpu_flags(AVX2_ONLY)) == "avx2"
    assert vk.native_level(vk.cpu_flags(SPR)) == "amx"
    assert vk.native_level(vk.cpu_flags(ZEN4)) == "avx512_bf16"
    assert vk.native_level(vk.cpu_flags("flags : sse2\n")) is None
    assert vk.check_level("avx2", "avx512_bf16") is None
    assert vk.check_level("avx512_bf16", "amx") is None  # an AMX CPU can hide its tiles
    assert "SIGILL" in vk.check_level("avx512", "avx2")
    assert "'amx' is above what this CPU supports (avx512_bf16)" in vk.check_level("amx", "avx512_bf16")
    assert "not one of avx2, avx512, avx512_bf16, amx" in vk.check_level("sse", "avx2")
    # AMX has no library of its own: its kernels are in the avx512_bf16 build (`_C`)
    assert [vk.build_of(x) for x in vk.LEVELS] == ["avx2", "avx512", "avx512_bf16", "avx512_bf16"]


def test_cap_hides_what_is_above_and_undo_restores():
    before = {n: getattr(torch.cpu, n)() for n in vk._PROBES if hasattr(torch.cpu, n)}
    undo = vk.cap("avx2")
    try:
        assert not any(getattr(torch.cpu, n)() for n in before)
        assert torch.cpu._is_avx2_supported() == vk.cpu_flags()["avx2"]  # not capped
    finally:
        undo()
    assert {n: getattr(torch.cpu, n)() for n in before} == before
    with pytest.raises(ValueError, match="K25EXP_VLLM_CPU_ISA='sse4'"):
        vk.cap("sse4")


def test_each_level_hides_what_is_above_it(monkeypatch):
    """On a CPU whose torch probes all say yes (an AMX machine, stood in for by the probes),
    each cap leaves exactly the probes of its level and below; `amx` hides nothing vLLM reads
    but AMX-FP16, a later generation no level names."""
    for name in vk._PROBES:
        monkeypatch.setattr(torch.cpu, name, lambda: True, raising=False)
    seen = {}
    for level in vk.LEVELS:
        undo = vk.cap(level)
        seen[level] = {n for n in vk._PROBES if getattr(torch.cpu, n)()}
        undo()
    assert seen == {"avx2": set(),
                    "avx512": {"_is_avx512_supported", "_is_vnni_supported"},
                    "avx512_bf16": {"_is_avx512_supported", "_is_vnni_supported",
                                    "_is_avx512_bf16_supported"},
                    "amx": {"_is_avx512_supported", "_is_vnni_supported",
                            "_is_avx512_bf16_supported", "_is_amx_tile_supported"}}


def test_the_suite_header_survives_a_vllm_build_without_cpu_mla(monkeypatch):
    """On a GPU box vLLM's CUDA build's CpuPlatform refuses MLA (NotImplementedError: "MLA is
    not supported on CPU."): the suite's header says so instead of stopping `pytest -m cuda`
    with an INTERNALERROR before any test runs."""
    import tests.conftest as suite

    def refuses(*a, **k):
        raise NotImplementedError("MLA is not supported on CPU.")

    monkeypatch.setattr(suite, "vllm_cpu_attention_backend", refuses)
    assert suite.pytest_report_header(None).endswith(
        "MLA attention none on this vLLM build (MLA is not supported on CPU.)")


@pytest.mark.vllm  # asks vLLM's own platform
def test_vllms_attention_choice_follows_amx_as_the_cap_leaves_it(monkeypatch):
    """What the suite expects of a served MLA model (tests/conftest.py asks vLLM's
    CpuPlatform): AMX_MLA where torch sees tiles unless CPU_MLA is asked for, CPU_MLA where it
    does not whatever is asked; an AMX CPU capped at avx512_bf16 takes CPU_MLA."""
    pytest.importorskip("vllm")
    from tests.conftest import vllm_cpu_attention_backend as picks

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert (picks(), picks("CPU_MLA"), picks("AMX_MLA"), picks("FLASHMLA")) == (
        "AMX_MLA", "CPU_MLA", "AMX_MLA", "AMX_MLA")
    assert picks(use_mla=False) == "CPU_ATTN"
    undo = vk.cap("avx512_bf16")
    try:
        assert (picks(), picks("AMX_MLA")) == ("CPU_MLA", "CPU_MLA")
    finally:
        undo()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert (picks(), picks("CPU_MLA"), picks("AMX_MLA")) == ("CPU_MLA", "CPU_MLA", "CPU_MLA")


def test_a_server_process_starts_capped(monkeypatch):
    """The launch environment of a capped server, in a real child interpreter: its
    sitecustomize caps torch's probes before anything else runs, and its compile caches are
    its own (inductor's key leaves out the vector ISA)."""
    if vk.native_level() is None:
        pytest.skip("needs an x86 CPU with AVX2")
    cfg = to_typed(compose_cfg("experiment=macro"), gpu_count=lambda: 0)
    env = server.launch_spec(cfg.server, Path("/m"), "cpu", cpu_isa="avx2").env
    assert env["K25EXP_VLLM_CPU_ISA"] == "avx2"
    assert env["TORCHINDUCTOR_CACHE_DIR"].endswith("_isa_avx2")
    assert env["VLLM_CACHE_ROOT"].endswith("vllm_isa_avx2")
    monkeypatch.delenv("K25EXP_VLLM_CPU_ISA", raising=False)  # this process uncapped: so is
    assert "K25EXP_VLLM_CPU_ISA" not in server.launch_spec(cfg.server, Path("/m"), "cpu").env
    monkeypatch.setenv("K25EXP_VLLM_CPU_ISA", "avx2")  # a capped process's servers are capped
    assert server.launch_spec(cfg.server, Path("/m"), "cpu").env == env
    code = ("import torch; print(torch.cpu._is_avx512_supported(), "
            "torch.cpu._is_avx512_bf16_supported(), torch.cpu._is_avx2_supported())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "False", "True"], out.stderr[-2000:]


def _child(code: str) -> subprocess.Popen:
    """A fresh interpreter that runs `code`, says "ready" and waits (its maps stay readable)."""
    p = subprocess.Popen([sys.executable, "-c", code + "\nprint('ready', flush=True)\n"
                          "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.vllm  # loads vLLM's kernels in a child process
def test_builds_reads_what_a_process_mapped():
    bare = _child("import torch")  # torch alone: no vLLM kernel library mapped
    try:
        assert vk.builds(bare.pid) == []
    finally:
        bare.kill()
    assert vk.builds(2 ** 22 + 12345) == []  # no such process
    assert vk.describe([]) == "none loaded" and vk.describe(["avx2", "avx512_bf16"]) == "avx2+avx512_bf16"
    pytest.importorskip("vllm")
    if vk.native_level() is None:
        pytest.skip("vLLM's CPU kernels need an x86 CPU with AVX2")
    loaded = _child("from k25exp import vllm_kernels; vllm_kernels.load()")
    try:  # the build vLLM picks for this CPU (or the suite's cap), and only it
        assert vk.builds(loaded.pid) == [vllm_cpu_build()]
    finally:
        loaded.kill()


def test_the_cap_is_checked_against_the_cpu_and_the_device(monkeypatch):
    """On an AVX2-only CPU (its /proc/cpuinfo flags stand in for this machine's), a cap above
    AVX2 is refused before anything runs: its kernels would die with SIGILL."""
    monkeypatch.setattr(vk, "cpu_flags", lambda cpuinfo=None: vk._parse(AVX2_ONLY))
    with pytest.raises(ConfigError, match=r"hardware.vllm_cpu_isa: 'avx512' is above what this "
                                          r"CPU supports \(avx2\)"):
        to_typed(compose_cfg("experiment=nccl_burst", "hardware.vllm_cpu_isa=avx512"),
                 gpu_count=lambda: 0)
    to_typed(compose_cfg("experiment=nccl_burst", "hardware.vllm_cpu_isa=avx2"), gpu_count=lambda: 0)


def test_the_cap_is_for_the_cpu_build_only():
    with pytest.raises(ConfigError, match=r"hardware.vllm_cpu_isa='avx2' caps the CPU build.*"
                                          r"hardware.device='cuda'"):
        to_typed(compose_cfg("experiment=gemm", "hardware=h200_x1", "hardware.vllm_cpu_isa=avx2"),
                 gpu_count=lambda: 1)
