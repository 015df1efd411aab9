"""A real torch.profiler trace, captured here: CPU activities, stack capture on, vLLM-style
step annotations around a tiny decode-like loop (RMSNorm, router top-k, matmuls, SiLU,
attention, a gloo all-reduce). Captured in a child process so this one never imports torch
or joins a process group."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from k25exp.traces import analyze, read_trace, write_outputs

DECODE = "execute_context_0(0)_generation_4(4)"
STEPS = 6

CAPTURE = textwrap.dedent(f"""
    import sys, torch, torch.distributed as dist
    from torch.profiler import profile, ProfilerActivity, record_function
    out, store = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    H, E = 128, 8
    w_up, w_down = torch.randn(H, 2 * H), torch.randn(H, H)
    gate = torch.randn(H, E)

    def layer(x):
        h = torch.nn.functional.rms_norm(x, (H,))
        q = h.view(1, 1, x.shape[0], H)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        x = x + a.view(x.shape[0], H)
        dist.all_reduce(x)
        h = torch.nn.functional.rms_norm(x, (H,))
        weights, experts = torch.topk(torch.sigmoid(torch.mm(h, gate)), 2)
        g, u = torch.mm(h, w_up).chunk(2, -1)
        y = torch.mm(torch.nn.functional.silu(g) * u, w_down)
        dist.all_reduce(y)
        return x + y

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], with_stack=True) as p:
        with record_function("execute_context_1(16)_generation_0(0)"):
            layer(torch.randn(16, H))
        x = torch.randn(4, H)
        for _ in range({STEPS}):
            with record_function("{DECODE}"):
                for _ in range(3):
                    x = layer(x)
                x = x.clone()
    p.export_chrome_trace(out)
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    d = tmp_path_factory.mktemp("real")
    path = d / "host.rank0.pt.trace.json.gz"
    script = d / "capture.py"
    script.write_text(CAPTURE)
    subprocess.run([sys.executable, str(script), str(path), str(d / "store")], check=True,
                   timeout=180, capture_output=True)
    return path


def test_steps_found_and_ops_classified(captured, tmp_path):
    a = analyze([captured])
    r = a.ranks[0]
    assert (r.label, r.rank, r.mode, r.step_source) == ("rank0", 0, "cpu", "user_annotation")
    assert (r.annotated_steps, r.decode_steps, r.steps_analysed) == (STEPS + 1, STEPS, STEPS)
    assert r.events_total > r.events_kept  # python_function frames dropped
    ks = {k.name: k for k in r.kernels}
    expect = {"aten::mm": "gemm_dense", "c10d::allreduce_": "comm_allreduce",
              "aten::topk": "moe", "aten::rms_norm": "norm_activation",
              "aten::silu": "norm_activation", "aten::sigmoid": "norm_activation",
              "aten::scaled_dot_product_attention": "attention", "aten::clone": "memory",
              "aten::add": "other"}
    for name, cat in expect.items():
        assert ks[name].category == cat, name
    # counts inside the decode steps only (the prefill step is left out)
    assert ks["c10d::allreduce_"].calls == STEPS * 3 * 2
    assert ks["aten::mm"].calls == STEPS * 3 * 3
    assert ks["aten::topk"].calls == STEPS * 3
    sh = r.shares()
    assert sum(sh.values()) == pytest.approx(100)
    for c in ("comm_allreduce", "gemm_dense", "moe", "attention", "norm_activation"):
        assert sh[c] > 0, c
    assert sh["comm_all_to_all"] == sh["gemm_quantized"] == 0
    # busy time per category is bounded by the ops' own self time
    assert r.overlap_share == pytest.approx(0, abs=1e-9)  # one thread: nothing overlaps
    m = write_outputs(a, tmp_path / "out")
    assert m["allreduce_share"] == pytest.approx(sh["comm_allreduce"])
    assert m["steps_analysed"] == STEPS


def test_parse_paths_and_chunks_agree_on_a_real_trace(captured):
    ref = read_trace(captured)
    for kw in ({"fast": False}, {"chunk_bytes": 4096}):
        t = read_trace(captured, **kw)
        assert [t.names[i] for i in t.name_id] == [ref.names[i] for i in ref.name_id]
        assert (t.start_ns == ref.start_ns).all() and (t.dur_ns == ref.dur_ns).all()
        assert t.metadata["distributedInfo"]["rank"] == 0


GPU_FIXTURE = Path(__file__).parent / "data" / "h200_decode_6steps.rank0.pt.trace.json.gz"


def test_real_h200_trace_kernels_classified():
    a = analyze([GPU_FIXTURE])
    r = a.ranks[0]
    assert (r.mode, r.step_source, r.rank) == ("gpu", "gpu_user_annotation", 0)
    assert (r.annotated_steps, r.decode_steps, r.steps_analysed) == (6, 5, 5)
    assert not r.warnings
    by = {}
    for k in r.kernels:
        by.setdefault(k.category, []).append(k.name)
    assert any(n.startswith("nvjet_sm90") for n in by["gemm_dense"])        # cuBLAS on Hopper
    assert any("splitKreduce" in n for n in by["gemm_dense"])
    assert any("layer_norm_kernel" in n for n in by["norm_activation"])     # rms_norm
    assert any("silu_kernel" in n for n in by["norm_activation"])
    assert any("gatherTopK" in n for n in by["moe"])                        # router top-k
    assert "Memcpy HtoD (Pageable -> Device)" in by["memory"]
    assert any("direct_copy_kernel" in n for n in by["memory"])
    assert not any(n.startswith("aten::") for ns in by.values() for n in ns)  # host ops ignored
    # every decode step launches the same kernels: 8 layers x 3 linear GEMMs on nvjet
    nvjet_calls = sum(k.calls for k in r.kernels if k.name.startswith("nvjet_sm90"))
    assert nvjet_calls == 5 * 8 * 5
    sh = r.shares()
    assert sum(sh.values()) == pytest.approx(100)
    assert sh["gemm_dense"] > sh["norm_activation"] > 0
    assert (r.busy_ns.sum(axis=1) <= r.step_ns).all()
