"""experiment=profile against the real vLLM CPU server (TP 2), and the analyser on the traces
that server wrote: the session campaign's profile phase (tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from k25exp.config.validate import ConfigError, to_typed
from k25exp.traces import analyze, load_rules
from tests.conftest import PROFILE_OUT, ROOT, compose_cfg, warm_python


class Logged:
    """A finished run's metrics and tags, in the shape the assertions below read."""

    def __init__(self, client, run):
        self.tags = run.data.tags
        self.keys = set(run.data.metrics)
        self.history = {k: {h.step: h.value for h in client.get_metric_history(run.info.run_id, k)}
                        for k in ("server_starts",)}


@pytest.fixture
def profiled(campaign_full):
    """The session campaign's profile run at concurrency 1 (the first of its sweep, on a
    fresh server): (metrics, logged, run folder, requests profiled)."""
    runs = [r for r in campaign_full.runs if r.data.tags.get("k25exp.experiment") == "profile"
            and r.data.params.get("experiment.concurrency") == "1"]
    (run,) = runs
    requests = max(int(run.data.params["experiment.requests"]), 1)
    return (run.data.metrics, Logged(campaign_full.client, run), Path(run.data.tags["k25exp.output_dir"]),
            requests)


@pytest.mark.vllm
def test_decode_steps_found_on_both_ranks_and_shares_add_up(profiled):
    metrics, rec, out, requests = profiled
    traces = sorted((out / "traces").iterdir())
    assert len(traces) == 2 and all(t.name.endswith(".pt.trace.json.gz") for t in traces)
    # one request at a time: each has PROFILE_OUT - 1 pure-decode steps (its first token
    # comes from the prefill step), on every rank
    assert metrics["steps_analysed"] == requests * (PROFILE_OUT - 1)
    categories = load_rules().categories
    for rank in ("rank0", "rank1"):
        table = {row["category"]: row for row in _csv(out / "breakdown" / "breakdown.csv")}
        total = sum(float(table[c][rank]) for c in categories) + float(table["idle"][rank])
        assert total == pytest.approx(100.0, abs=0.05)
    total = sum(metrics[f"share_{c}"] for c in categories) + metrics["share_idle"]
    assert total == pytest.approx(100.0, abs=0.05)
    # the CPU build's decode step: shm all-reduce, fused MoE, MLA attention, oneDNN GEMMs
    assert metrics["allreduce_share"] > 0 and metrics["allreduce_share"] == metrics["share_comm_allreduce"]
    assert metrics["share_moe"] > 0 and metrics["share_attention"] > 0 and metrics["share_gemm"] > 0
    # every vLLM kernel the step runs has its category, whichever attention backend this CPU's
    # server picked (on an AMX CPU, AMX_MLA's _C::bmm_cpu once fell in `other`)
    kernels = _csv(out / "breakdown" / "top_kernels.csv")
    assert [k["name"] for k in kernels if k["name"].startswith("_C") and k["category"] == "other"] == []
    assert rec.tags["trace.step_source"] == "user_annotation"
    # vLLM's scopes (k25exp.traces.step_phases): each cycle's phases add up to it, the sampler
    # ran in its own scope and, without speculation, no drafter did
    parts = ("verify", "sample", "draft", "bookkeep", "other", "gap")
    assert sum(metrics[f"phase_{p}_ms"] for p in parts) == pytest.approx(metrics["phase_cycle_ms"])
    assert metrics["phase_sample_ms"] > 0 and metrics["phase_draft_ms"] == 0
    # the rules' categories, whose shares with idle make up the step (the report counts each)
    rules = yaml.safe_load((ROOT / "conf" / "trace_rules" / "default.yaml").read_text())
    assert rec.tags["trace.categories"].split(",") == rules["categories"]
    assert rec.history["server_starts"] == {0: 1.0}
    assert "stop_profile_s" in rec.keys
    assert not rec.keys & {"tpot_ms_p50", "output_tok_s"}  # never reported
    # the level once more without the profiler: its requests' mean TPOT, by hand from the JSONL
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    plain = [r for r in rows if r["phase"] == "unprofiled"]
    # before it, one round of the level (concurrency 1: one request), outside every figure
    assert len([r for r in rows if r["phase"] == "warmup" and r["level"] == 1]) == 1
    # sent as the macro sends a level: max(8, reference_rounds × concurrency 1) requests
    rounds = yaml.safe_load((out / "config.resolved.yaml").read_text())["experiment"]["reference_rounds"]
    assert len(plain) == max(8, rounds * 1) and all(r["ok"] for r in plain)
    tpots = [(r["chunk_s"][-1] - r["chunk_s"][0]) / (r["usage"]["completion_tokens"] - 1) * 1e3
             for r in plain]
    assert metrics["unprofiled_tpot_n"] == len(plain)
    assert metrics["unprofiled_tpot_ms_mean"] == pytest.approx(sum(tpots) / len(tpots), rel=1e-6)


@pytest.mark.vllm
def test_the_steps_collectives_timed_inside_the_servers_workers(profiled):
    """server_burst_*: the step's 2 × layers + 2 ops timed in the server's own TP workers; the
    figures recomputed by hand from the marks the workers returned (server_burst.json)."""
    metrics, rec, out, _ = profiled
    doc = json.loads((out / "server_burst.json").read_text())
    cfg = compose_cfg("experiment=profile", "model=tiny_kimi")
    layers, hidden = cfg.model.num_hidden_layers, cfg.model.hidden_size
    assert [o[0] for o in doc["ops"]] == (["embedding"] + [f"layer{i}.{p}" for i in range(layers)
                                                           for p in ("attn", "mlp")] + ["logits"])
    assert [o[2] for o in doc["ops"][:-1]] == [hidden] * (2 * layers + 1)  # 1 token: hidden elements
    res = doc["results"]
    assert [r["rank"] for r in res] == [0, 1] and all(r["world"] == 2 and r["check_ok"] for r in res)
    bursts = int(metrics["server_burst_bursts"])
    assert all(len(r["marks_ns"]) == bursts and all(len(b) == len(doc["ops"]) for b in r["marks_ns"])
               for r in res)
    transport, total = [], []
    for b in range(bursts):
        ops = [r["marks_ns"][b] for r in res]
        t = 0
        for i in range(len(doc["ops"])):
            last = max(o[i][0] for o in ops)
            t += sum(o[i][1] - last for o in ops)
        transport.append(t / 2 / 1e6)
        total.append(max(o[-1][1] - o[0][0] for o in ops) / 1e6)
    transport.sort(), total.sort()
    mid = bursts // 2  # an even count: numpy's median is the mean of the middle two
    med = (lambda xs: (xs[mid - 1] + xs[mid]) / 2) if bursts % 2 == 0 else (lambda xs: xs[mid])
    assert metrics["server_burst_transport_ms"] == pytest.approx(med(transport))
    assert metrics["server_burst_ms"] == pytest.approx(med(total))
    assert metrics["server_burst_op_samples"] == 2 * bursts * len(doc["ops"])
    assert metrics["server_burst_wrong_ranks"] == 0
    assert "inside the server's TP workers" in rec.tags["server_burst.timing"]


SPLIT = ("share_comm_wait", "share_comm_transport", "comm_wait_ms_per_step",
         "comm_transport_ms_per_step", "comm_raw_ms_per_step", "comm_calls_matched")


@pytest.mark.vllm
def test_collectives_split_into_wait_and_transport_on_both_ranks(profiled):
    metrics, rec, out, _ = profiled
    logged = rec.keys
    for k in SPLIT:
        assert {k, f"{k}_min", f"{k}_median", f"{k}_max"} <= logged, k
    table = {row["category"]: row for row in _csv(out / "breakdown" / "breakdown.csv")}
    assert {"[comm_wait]", "[comm_transport]", "comm_raw_ms"} <= set(table)
    paths = sorted((out / "traces").iterdir())
    a = analyze(paths)
    assert [r.label for r in a.ranks] == ["rank0", "rank1"] and a.comm_split.reason is None
    ref = min(_base_ns(p) for p in paths)  # one clock for both, kept near zero (see below)
    hand = [_calls_by_hand(p, ref) for p in paths]
    for r, mine in zip(a.ranks, hand):
        m = r.metrics()
        # every outermost communication cpu_op starting in a pure-decode step, counted from
        # the JSON, is matched, unmatched or unsplittable
        assert m["comm_calls"] == sum(len(v) for v in mine.values()) > 0
        assert m["comm_calls_matched"] + m["comm_calls_unmatched"] + m["comm_calls_unsplittable"] \
            == m["comm_calls"]
    # The split by hand from the JSON: the k-th call of a category in the i-th decode step on
    # both ranks; last arrival = the later start; a rank's wait = last − its start, transport
    # = its end − last (calls that end on a rank before the last arrival are left out).
    wait, transport, n = [0.0, 0.0], [0.0, 0.0], 0
    for key, calls0 in hand[0].items():
        for (s0, e0), (s1, e1) in zip(calls0, hand[1].get(key, [])):
            last = max(s0, s1)
            if min(e0, e1) < last:
                continue
            n += 1
            for rk, (s_, e_) in enumerate(((s0, e0), (s1, e1))):
                wait[rk] += last - s_
                transport[rk] += e_ - last
    assert n == a.ranks[0].metrics()["comm_calls_matched"]
    for rk, r in enumerate(a.ranks):  # µs; the JSON's µs floats vs the reader's integer ns
        assert r.comm_split.wait_ns.sum() / 1e3 == pytest.approx(wait[rk], abs=0.01 * n)
        assert r.comm_split.transport_ns.sum() / 1e3 == pytest.approx(transport[rk], abs=0.01 * n)
    # The ranks end each collective together: a rank that spends more time in the calls
    # spends it waiting for the other (skew), not on the link. When one rank's raw time
    # exceeds the other's by a fifth or more, the difference is mostly wait.
    raw = [w + t for w, t in zip(wait, transport)]
    if abs(raw[0] - raw[1]) > 0.2 * max(raw):
        slow = int(raw[1] > raw[0])
        assert wait[slow] - wait[1 - slow] > abs(transport[0] - transport[1])
        assert wait[slow] - wait[1 - slow] > 0.5 * (raw[slow] - raw[1 - slow])


def _base_ns(path) -> int:
    import gzip
    return int(json.load(gzip.open(path)).get("baseTimeNanoseconds", 0))


def _calls_by_hand(path, ref_ns: int) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """{(decode step index, category): [(start µs, end µs), ...] in time order} on the host
    clock (ts + baseTimeNanoseconds − ref_ns; the epoch's 1.8e15 µs in a float would round
    every time to 0.25 µs, enough to move 744 calls' sum past the 0.01 µs-per-call tolerance):
    the outermost communication cpu_ops starting in a
    pure-decode step annotation, read straight from the JSON.

    On the path the run took. With the shared-memory all-reduce (AVX-512) the op runs the
    collective on its own thread. On gloo (vLLM's AVX2 build) the op only enqueues it and a
    gloo worker thread runs it (a `gloo:<op>` user annotation), while the caller blocks in a
    wait the profiler does not record: the caller was in the collective until that span
    ended. So, by hand: per category, in start order, the k-th op takes the first unused
    worker span that starts at or after it and before the category's next op, and ends when
    that span ends."""
    import gzip
    import math
    import re

    rules = load_rules()
    comm = set(rules.groups["communication"])
    doc = json.load(gzip.open(path))
    base = (int(doc.get("baseTimeNanoseconds", 0)) - ref_ns) / 1000
    events = doc["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "user_annotation"
                   and re.fullmatch(r"execute_context_0\(0\)_generation_[1-9]\d*\(\d+\)", e["name"]))
    ops = sorted((str((e["pid"], e["tid"])), e["ts"], -e["dur"], rules.classify(e["name"], "cpu_op"))
                 for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                 and rules.classify(e["name"], "cpu_op") in comm)
    outer: list[list] = []  # [start, end, category] of each outermost op
    reach: dict[str, float] = {}
    for lane, s, neg_dur, cat in ops:  # by lane, start, longest first: an op inside an
        e = s - neg_dur                # earlier one is nested in it
        if s >= reach.get(lane, -math.inf):
            outer.append([s, e, cat])
        reach[lane] = max(reach.get(lane, -math.inf), e)
    workers = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
               and e["name"].startswith("gloo:")]
    for cat in {rules.classify(w["name"], "user_annotation") for w in workers}:
        mine = sorted((o for o in outer if o[2] == cat), key=lambda o: o[0])
        spans = sorted((w["ts"], w["ts"] + w["dur"]) for w in workers
                       if rules.classify(w["name"], "user_annotation") == cat)
        j = 0
        for k, o in enumerate(mine):
            while j < len(spans) and spans[j][0] < o[0]:
                j += 1
            if j == len(spans):
                break
            if k + 1 < len(mine) and spans[j][0] >= mine[k + 1][0]:
                continue  # no gloo work of its own
            o[1] = max(o[1], spans[j][1])
            j += 1
    out: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for s, e, cat in sorted(outer):
        j = next((i for i, (a, b) in enumerate(steps) if a <= s < b), None)
        if j is not None:
            out.setdefault((j, cat), []).append((s + base, e + base))
    return out



def test_profile_needs_a_profiler_config():
    with pytest.raises(ConfigError, match="experiment=profile needs"):
        to_typed(compose_cfg("experiment=profile", "server.profiler=null"), gpu_count=lambda: 0)
    with pytest.raises(ConfigError, match="experiment.trace_dir: required with server=endpoint"):
        to_typed(compose_cfg("experiment=profile", "server=endpoint",
                             "server.base_url=http://127.0.0.1:1"), gpu_count=lambda: 0)


@pytest.mark.e2e
def test_analyze_cli_names_a_bad_file(tmp_path):
    bad = tmp_path / "rank0.pt.trace.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00truncated")
    r = subprocess.run([warm_python(), "-m", "k25exp", "analyze", str(bad)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and str(bad) in r.stderr


def _csv(path):
    import csv

    return list(csv.DictReader(open(path)))
