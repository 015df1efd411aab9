"""Benchmark: k25exp's trace analyser vs a plain json.load vs HolisticTraceAnalysis.

The trace is REAL, captured here with torch.profiler (CPU activities, with_stack=True, so
python_function frames make up part of it, as in a vLLM profile with stack capture on)
around a decode-like loop: 8 Kimi-shaped layers (RMSNorm, attention, router top-k, MLP,
two gloo all-reduces per layer) under vLLM's step annotations
(`execute_context_0(0)_generation_4(4)`, one prefill step first). 1,200 steps give a
~50 MB .json.gz of ~2.7 million events (~740 MB of JSON). It is cached in --workdir.
`--trace FILE` benchmarks an existing trace instead (e.g. a GPU capture).

Every tool runs in its own child process; wall time is the tool's work (imports excluded,
reported apart) and peak memory is the child's max RSS (getrusage, imports included):

  k25exp analyze       k25exp.traces.analyze([trace]): read + decode-step breakdown
  k25exp reader        k25exp.traces.read_trace only (the parse)
  json.load            gzip.open + json.load of the whole file (stdlib), nothing else
  orjson whole file    gzip decompress + orjson.loads of the whole file (parse strategy)
  ijson streaming      ijson (yajl2_c) over traceEvents keeping the needed fields (strategy)
  HTA (json backend)   HolisticTraceAnalysis 0.5: TraceAnalysis(trace_dir=...) (its default
                       parser, json.loads of the whole file, into pandas), then
                       get_temporal_breakdown() (it needs ProfilerStep annotations, which
                       vLLM-style traces lack: it fails, and the note says how) and
                       get_gpu_kernel_breakdown(); wall = load + both
  HTA (ijson backend)  the same with HTA's IJSON_BATCH_AND_COMPRESS parser (needs ijson with
                       the yajl2_c backend in HTA's venv)

HTA runs in its own venv (--hta-python, default .hta-venv/bin/python; create it with
`python3 -m venv .hta-venv && .hta-venv/bin/pip install HolisticTraceAnalysis ijson`),
on a folder holding only this trace (HTA reads every trace file of a folder, one per rank,
and takes the rank from the trace's distributedInfo).

    .venv/bin/python -m benchmarks.trace_analyzer_bench [--steps 1200] [--skip-hta]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout (benchmarks/ → ..)

CAPTURE = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch.profiler import profile, ProfilerActivity, record_function
    out, store, steps, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    cuda = device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", init_method="file://" + store,
                            rank=0, world_size=1)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    H = 1024 if cuda else 64
    dtype = torch.bfloat16 if cuda else torch.float32

    class Layer(torch.nn.Module):
        def __init__(s):
            super().__init__()
            s.qkv, s.o = torch.nn.Linear(H, 3 * H), torch.nn.Linear(H, H)
            s.up, s.down = torch.nn.Linear(H, 4 * H), torch.nn.Linear(2 * H, H)
            s.gate = torch.nn.Linear(H, 8)

        def forward(s, x):
            h = torch.nn.functional.rms_norm(x, (H,))
            q, k, v = s.qkv(h).chunk(3, -1)
            a = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]
            x = x + s.o(a)
            dist.all_reduce(x)
            h = torch.nn.functional.rms_norm(x, (H,))
            w, idx = torch.topk(torch.sigmoid(s.gate(h)), 2)
            g, u = s.up(h).chunk(2, -1)
            x = x + s.down(torch.nn.functional.silu(g) * u)
            dist.all_reduce(x)
            return x

    model = torch.nn.Sequential(*[Layer() for _ in range(8)]).to(device, dtype)
    ids = torch.arange(4)
    x = torch.randn(4, H, device=device, dtype=dtype)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.no_grad():
        model(x)  # warm-up outside the capture
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=acts, with_stack=True) as p:
            for i in range(steps):
                name = ("execute_context_1(16)_generation_0(0)" if i == 0
                        else "execute_context_0(0)_generation_4(4)")
                with record_function(name):
                    ids.to(device)                    # input ids: a host-to-device copy
                    model(x)
            if cuda:
                torch.cuda.synchronize()
    p.export_chrome_trace(out)
    dist.destroy_process_group()
""")

# Each child prints one JSON line: {"wall_s", "import_s", "peak_mb", "note"}.
PRELUDE = textwrap.dedent("""
    import json, resource, sys, time
    path = sys.argv[1]
    t_imp = time.perf_counter()
""")
EPILOGUE = textwrap.dedent("""
    print(json.dumps({"wall_s": wall, "import_s": imp, "note": note,
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""")

TOOLS = {
    "k25exp analyze": """
        from k25exp.traces import analyze
        imp = time.perf_counter() - t_imp
        t = time.perf_counter()
        a = analyze([path])
        wall = time.perf_counter() - t
        r = a.ranks[0]
        note = (f"{r.events_total} events, {r.events_kept} kept, {r.steps_analysed} steps, "
                f"step {r.decode_step_ms:.3f} ms, allreduce {a.metrics()['allreduce_share']:.1f} %, "
                f"read {r.read_s:.2f} s + analyse {r.analyse_s:.2f} s")
    """,
    "k25exp reader": """
        from k25exp.traces import read_trace
        imp = time.perf_counter() - t_imp
        t = time.perf_counter()
        tr = read_trace(path)
        wall = time.perf_counter() - t
        note = f"{tr.events_total} events, {tr.n_events} kept"
    """,
    "json.load": """
        import gzip
        imp = time.perf_counter() - t_imp
        t = time.perf_counter()
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
            d = json.load(f)
        wall = time.perf_counter() - t
        note = f"{len(d['traceEvents'])} events, nothing analysed"
    """,
    "orjson whole file": """
        import gzip, orjson
        imp = time.perf_counter() - t_imp
        t = time.perf_counter()
        raw = open(path, "rb").read()
        d = orjson.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)
        wall = time.perf_counter() - t
        note = f"{len(d['traceEvents'])} events, nothing analysed"
    """,
    "ijson streaming": """
        import gzip, ijson
        imp = time.perf_counter() - t_imp
        t = time.perf_counter()
        keep, n = [], 0
        want = {"kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation", "gpu_user_annotation"}
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
            for e in ijson.items(f, "traceEvents.item", use_float=True):
                n += 1
                if e.get("cat") in want:
                    keep.append((e.get("name"), e.get("cat"), e.get("ts"), e.get("dur"),
                                 e.get("pid"), e.get("tid")))
        wall = time.perf_counter() - t
        note = f"{n} events, {len(keep)} kept (backend {ijson.backend}), nothing analysed"
    """,
}

HTA_BODY = """
    import os
    {backend}
    from hta.trace_analysis import TraceAnalysis
    imp = time.perf_counter() - t_imp
    t = time.perf_counter()
    ta = TraceAnalysis(trace_dir=os.path.dirname(path))
    load = time.perf_counter() - t
    note = f"load {{load:.2f}} s (ranks {{sorted(ta.t.traces)}})"
    try:
        t2 = time.perf_counter()
        bd = ta.get_temporal_breakdown(visualize=False)
        note += f"; temporal breakdown {{time.perf_counter() - t2:.2f}} s"
    except Exception as e:
        note += f"; temporal breakdown failed: {{type(e).__name__}} {{str(e)[:200]}}"
    t3 = time.perf_counter()
    kb = ta.get_gpu_kernel_breakdown(visualize=False)[0]
    note += (f"; kernel breakdown {{time.perf_counter() - t3:.2f}} s: "
             + repr(kb.to_dict("records"))[:200])
    wall = time.perf_counter() - t
"""
HTA_TOOLS = {
    "HTA (json backend)": HTA_BODY.format(backend=""),
    "HTA (ijson backend)": HTA_BODY.format(backend=(
        "from hta.configs.parser_config import ParserBackend, ParserConfig; "
        "cfg = ParserConfig.get_default_cfg(); "
        "cfg.set_parser_backend(ParserBackend.IJSON_BATCH_AND_COMPRESS); "
        "ParserConfig.set_default_cfg(cfg)")),
}


def run_tool(python: str, body: str, trace: Path, timeout: float, env: dict | None = None) -> dict:
    code = PRELUDE + textwrap.dedent(body) + EPILOGUE
    t = time.perf_counter()
    try:
        p = subprocess.run([python, "-c", code, str(trace)], capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"wall_s": None, "peak_mb": None, "import_s": None,
                "note": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"wall_s": None, "peak_mb": None, "import_s": None,
                "note": f"failed (exit {p.returncode}) after {time.perf_counter() - t:.1f} s: {err[:400]}"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1])


def capture(workdir: Path, steps: int, device: str = "cpu") -> Path:
    trace_dir = workdir / f"{device}_{steps}steps"
    trace = trace_dir / "bench.rank0.pt.trace.json.gz"
    if trace.exists():
        return trace
    trace_dir.mkdir(parents=True, exist_ok=True)
    script = workdir / "capture.py"
    script.write_text(CAPTURE)
    store = workdir / "store"
    store.unlink(missing_ok=True)
    print(f"capturing {steps} steps with torch.profiler (stack capture on) -> {trace} ...",
          flush=True)
    t = time.perf_counter()
    tmp = trace.with_name("partial.pt.trace.json.gz")
    subprocess.run([sys.executable, str(script), str(tmp), str(store), str(steps), device],
                   check=True, cwd=workdir)
    tmp.rename(trace)
    print(f"captured in {time.perf_counter() - t:.0f} s", flush=True)
    return trace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, help="benchmark this trace instead of capturing one")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/k25exp-trace-bench"))
    ap.add_argument("--steps", type=int, default=1200, help="decode steps to capture (1200: ~50 MB)")
    ap.add_argument("--hta-python", default=str(ROOT / ".hta-venv" / "bin" / "python"))
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--tools", default="", help="comma-separated subset of tool names")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="capture on the CPU (default) or a CUDA GPU (NCCL, bf16, H=1024)")
    ap.add_argument("--capture-only", action="store_true", help="capture the trace and stop")
    args = ap.parse_args()

    trace = (args.trace.resolve() if args.trace
             else capture(args.workdir.resolve(), args.steps, args.device))
    if args.capture_only:
        print(trace)
        return 0
    size_mb = trace.stat().st_size / 1e6
    print(f"trace: {trace} ({size_mb:.1f} MB on disk)", flush=True)
    tools = dict(TOOLS)
    if not args.skip_hta:
        tools.update(HTA_TOOLS)
    if args.tools:
        wanted = {t.strip() for t in args.tools.split(",")}
        tools = {k: v for k, v in tools.items() if k in wanted}

    results = {}
    for name, body in tools.items():
        python = args.hta_python if name.startswith("HTA") else sys.executable
        env = None
        if name.startswith("HTA"):
            if not Path(python).exists():
                results[name] = {"wall_s": None, "peak_mb": None, "import_s": None,
                                 "note": f"{python} missing (see the docstring)"}
                continue
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        print(f"running {name} ...", flush=True)
        results[name] = run_tool(python, body, trace, args.timeout, env)
        r = results[name]
        print(f"  {r['wall_s'] if r['wall_s'] is None else round(r['wall_s'], 2)} s, "
              f"{r['peak_mb'] if r['peak_mb'] is None else round(r['peak_mb'])} MB: {r['note']}",
              flush=True)

    print()
    print(f"# {trace.name}: {size_mb:.1f} MB gzipped; {os.cpu_count()} CPUs")
    print(f"#{'tool':>22}{'wall s':>10}{'peak MB':>10}{'import s':>10}")
    fmt = lambda v, f: "-" if v is None else f.format(v)  # noqa: E731
    for name, r in results.items():
        print(f" {name:>22}{fmt(r['wall_s'], '{:.2f}'):>10}{fmt(r['peak_mb'], '{:.0f}'):>10}"
              f"{fmt(r['import_s'], '{:.2f}'):>10}")
    ours = results.get("k25exp analyze", {}).get("wall_s")
    for name, r in results.items():
        if name != "k25exp analyze" and ours and r.get("wall_s"):
            print(f"# {name} / k25exp analyze: {r['wall_s'] / ours:.1f}x the time")
    if args.json:
        args.json.write_text(json.dumps({"trace": str(trace), "size_mb": size_mb,
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
