"""Pairing runs by experiment and swept values, and the refusal of different experiments."""

from __future__ import annotations

import pytest

from k25exp.compare.envdiff import tag_diff
from k25exp.compare.resolve import CompareError, Side, match
from k25exp.tracking.read import RunView


def run(rid: str, exp: str, t: int = 0, tags: dict | None = None, **params) -> RunView:
    return RunView(rid, "1", exp, "FINISHED", t, params={"paths.outputs": f"/o/{rid}", **params},
                   tags=tags or {})


def test_sweeps_pair_by_swept_values_not_by_order():
    a = Side("pa", "sweep", [run("a1", "nccl_burst", **{"experiment.tokens": "1"}),
                             run("a8", "nccl_burst", **{"experiment.tokens": "8"})])
    b = Side("pb", "sweep", [run("b8", "nccl_burst", **{"experiment.tokens": "8"}),
                             run("b1", "nccl_burst", **{"experiment.tokens": "1"}),
                             run("b64", "nccl_burst", **{"experiment.tokens": "64"})])
    pairs, unmatched = match(a, b)
    assert [(p.a.run_id, p.b.run_id, p.swept) for p in pairs] == [
        ("a1", "b1", {"experiment.tokens": "1"}), ("a8", "b8", {"experiment.tokens": "8"})]
    assert unmatched == ["nccl_burst [experiment.tokens=64]: only in B (run b64)"]


def test_different_experiments_are_refused_by_name():
    a = Side("ra", "run", [run("ra", "macro")])
    b = Side("rb", "run", [run("rb", "nccl_burst")])
    with pytest.raises(CompareError, match=r"A \(run ra\) holds runs of experiment macro; B \(run rb\) "
                                           r"holds nccl_burst: runs of different experiments"):
        match(a, b)


def test_campaigns_pair_what_both_have_and_name_the_rest():
    a = Side("c1", "campaign", [run("m1", "macro"), run("g1", "gemm")])
    b = Side("c2", "campaign", [run("m2", "macro")])
    pairs, unmatched = match(a, b)
    assert [(p.a.run_id, p.b.run_id) for p in pairs] == [("m1", "m2")]
    assert unmatched == ["gemm: only A has runs of it (1)"]


def test_tag_diff_leaves_out_run_specific_tags():
    a = Side("a", "run", [run("a", "macro", tags={"env.cpu_affinity": "2", "mlflow.runName": "x",
                                                  "k25exp.output_dir": "/o/a", "torch": "2.13"})])
    b = Side("b", "run", [run("b", "macro", tags={"env.cpu_affinity": "1", "mlflow.runName": "y",
                                                  "k25exp.output_dir": "/o/b", "torch": "2.13"})])
    assert tag_diff(a, b) == [("env.cpu_affinity", "2", "1")]


def test_tag_diff_leaves_out_processes_liveness_sub_run_servers_and_results():
    # what two runs of one commit on one machine differed in, besides the environment
    # (seen comparing two embedded-default campaigns)
    common = {"vllm.attention_backend": "CPU_MLA"}
    a = Side("a", "run", [run("a", "spec_decode", tags={
        **common, "k25exp.pid": "21269", "k25exp.heartbeat": "1796120958.2", "k25exp.pid_start": "1",
        "baseline/server.pid": "22609", "baseline/server.log": "/s/a.log", "traces": "a.json.gz",
        "knee": "16", "baseline/saturation": "2", "vllm.cudagraph_mode": "NONE"})])
    b = Side("b", "run", [run("b", "spec_decode", tags={
        **common, "k25exp.pid": "23034", "k25exp.heartbeat": "1796121429.8", "k25exp.pid_start": "2",
        "baseline/server.pid": "24383", "baseline/server.log": "/s/b.log", "traces": "b.json.gz",
        "knee": "8", "baseline/saturation": "1", "vllm.cudagraph_mode": "FULL"})])
    assert tag_diff(a, b) == [("vllm.cudagraph_mode", "NONE", "FULL")]



def test_tag_diff_over_paired_runs_only():
    # a campaign (macro + nccl_burst) against a macro-only campaign: the burst's tags are not
    # "absent" on B, they belong to a run nothing was compared with
    from k25exp.compare.resolve import Pair

    ma = run("ma", "macro", tags={"vllm.enforce_eager": "true"})
    nb = run("nb", "nccl_burst", tags={"backend": "gloo"})
    mb = run("mb", "macro", tags={"vllm.enforce_eager": "false"})
    a, b = Side("a", "campaign", [ma, nb]), Side("b", "campaign", [mb])
    assert tag_diff(a, b) == [("backend", "gloo", "(absent)"), ("vllm.enforce_eager", "true", "false")]
    assert tag_diff(a, b, [Pair("macro", {}, ma, mb)]) == [("vllm.enforce_eager", "true", "false")]


def test_the_cpu_isa_and_vllms_kernel_build_are_environment():
    """Two collective runs of one commit, one on an AVX2-only CPU: the environment diff names
    the CPU's ISA flags (envinfo reads them from /proc/cpuinfo) and the build vLLM loaded."""
    from k25exp.envinfo import cpu_tags

    flags = cpu_tags()["env.cpu_isa_flags"].split()
    have = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":")[1].split()
    assert flags == [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16") if f in have]
    a = Side("a", "run", [run("a", "nccl_burst", tags={"env.cpu_isa_flags": "avx2 avx512f avx512_bf16",
                                                       "vllm.cpu_isa": "avx512_bf16"})])
    b = Side("b", "run", [run("b", "nccl_burst", tags={"env.cpu_isa_flags": "avx2",
                                                       "vllm.cpu_isa": "avx2"})])
    assert tag_diff(a, b) == [("env.cpu_isa_flags", "avx2 avx512f avx512_bf16", "avx2"),
                              ("vllm.cpu_isa", "avx512_bf16", "avx2")]
