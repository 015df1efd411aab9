"""The raw samples behind each figure, from the artifacts a run kept.

A figure is (metric name, step or None). Each experiment kind maps its figures to the samples
they summarise:

* macro / spec_decode: `requests.jsonl` (spec_decode: `spec/` and, prefixed `baseline/`,
  `baseline/`): per request TPOT, TTFT, E2E and the median of its inter-chunk gaps (ITL), of
  the single-stream phase (`single_stream_*`) and of each sweep level (step = concurrency, or
  an open loop's rate or a trace's speedup x 1000: level_steps); per level also TTFT and E2E
  from the scheduled send (`ttft_sched_ms_*`, `e2e_sched_ms_*`: the user's view of an open
  loop, a trace or a session's turn) and, for multi-turn sessions, each turn's TTFT
  (`turn<k>_ttft_ms_*`, its samples that turn's requests).
  One ITL sample per request, not per gap: a request's gaps share its batch, its position
  and its stalls, so pooling them as independent samples would make p-values far too small.
* nccl_burst, allreduce_sweep, all_to_all: `raw/` (the ranks' files, read as the runner reads
  them, each sample the slowest rank's): per burst the queued time (and the bandwidth over
  it), per op the blocking latency, per replay the CUDA-graph time.
* gemm: `samples.jsonl`: every timed call of each (shape, kernel, M), for `<shape>/<kernel>/latency_us`
  (runs from before it was kept have none, and say so).

Samples test a figure's location (median / mean). Tail percentiles (p90, p99) are not
tested: a change of a p99 from a few dozen samples is not something a rank test answers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Optional

import orjson

from k25exp.stats import median

Figure = tuple[str, Optional[int]]  # (metric, step); step None = a run-level figure
Samples = dict[Figure, list[float]]

TAIL = re.compile(r"_p(9\d|99)(_|$)")


def _records(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _request_values(recs: list[dict]) -> dict[str, list[float]]:
    """Per-request values in ms (ITL: the request's median gap), of the requests that
    succeeded."""
    ok = [r for r in recs if r.get("ok")]
    out = {"tpot_ms": [r["tpot_s"] * 1e3 for r in ok if r.get("tpot_s") is not None],
           "ttft_ms": [r["ttft_s"] * 1e3 for r in ok if r.get("ttft_s") is not None],
           "e2e_ms": [r["e2e_s"] * 1e3 for r in ok if r.get("e2e_s") is not None],
           "itl_ms": [median([b - a for a, b in zip(r["chunk_s"], r["chunk_s"][1:])]) * 1e3
                      for r in ok if len(r["chunk_s"]) >= 2],  # one per request (docstring)
           "tpot_ms_no_stalls": [r["tpot_s"] * 1e3 for r in ok
                                 if r.get("tpot_s") is not None and not r.get("stalls")],
           # from the scheduled send (open loop, trace, sessions: what goodput and the SLO judge)
           "ttft_sched_ms": [r["ttft_sched_s"] * 1e3 for r in ok if r.get("ttft_sched_s") is not None],
           "e2e_sched_ms": [r["e2e_sched_s"] * 1e3 for r in ok if r.get("e2e_sched_s") is not None]}
    return out


def _turn_values(recs: list[dict]) -> dict[int, list[float]]:
    """A sessions level's TTFT (ms) by turn, of the turns that succeeded (k25exp.load.sessions:
    the figures turn<k>_ttft_ms_*)."""
    out: dict[int, list[float]] = {}
    for r in recs:
        if r.get("turn") is not None and r.get("ok") and r.get("ttft_s") is not None:
            out.setdefault(r["turn"], []).append(r["ttft_s"] * 1e3)
    return out


def level_steps(sweep: list[dict]) -> dict:
    """{level: the MLflow step its figures were logged at}: the records' own `step`; records
    written before they carried one: the concurrency, or for an open loop's level (every
    request's worker null) its rate x 1000, as the runner logs it."""
    out = {}
    for r in sweep:
        if "step" in r:
            out[r["level"]] = r["step"]
    for level in {r["level"] for r in sweep} - set(out):
        open_loop = all("worker" in r and r["worker"] is None for r in sweep if r["level"] == level)
        out[level] = int(round(level * 1000)) if open_loop else int(level)
    return out


def serving_samples(jsonl: Path, prefix: str = "") -> Samples:
    recs = _records(jsonl)
    out: Samples = {}
    single = _request_values([r for r in recs if r.get("phase") == "single"])
    for metric, what in (("single_stream_tpot_ms", "tpot_ms"), ("single_stream_tpot_ms_mean", "tpot_ms"),
                         ("single_stream_ttft_ms", "ttft_ms"), ("single_stream_itl_ms_p50", "itl_ms"),
                         ("single_stream_e2e_ms", "e2e_ms"),
                         ("single_stream_tpot_ms_no_stalls", "tpot_ms_no_stalls"),
                         ("single_stream_tpot_ms_mean_no_stalls", "tpot_ms_no_stalls")):
        if single[what]:
            out[(prefix + metric, None)] = single[what]
    sweep = [r for r in recs if r.get("phase") == "sweep"]
    steps = level_steps(sweep)
    for c in sorted(set(steps.values())):
        vals = _request_values([r for r in sweep if steps[r["level"]] == c])
        for what in ("tpot_ms", "ttft_ms", "e2e_ms", "itl_ms", "ttft_sched_ms", "e2e_sched_ms"):
            if vals[what]:
                for stat in ("p50", "mean"):
                    out[(f"{prefix}{what}_{stat}", c)] = vals[what]
        for turn, xs in _turn_values([r for r in sweep if steps[r["level"]] == c]).items():
            for stat in ("p50", "mean"):
                out[(f"{prefix}turn{turn}_ttft_ms_{stat}", c)] = xs
        if vals["tpot_ms_no_stalls"]:
            for stat in ("mean", "p50"):
                out[(f"{prefix}tpot_ms_{stat}_no_stalls", c)] = vals["tpot_ms_no_stalls"]
    return out


def collective_samples(raw: Path, experiment: str) -> Samples:
    from k25exp.collectives.results import read_rank_files

    files = read_rank_files(raw)
    world = files.world_size
    out: Samples = {}
    for p in files.points:
        q = p.queued_s
        per_op_s = [s / p.burst for s in q]
        op = "all_to_all" if experiment == "all_to_all" else "all_reduce"
        times = q if experiment == "nccl_burst" else per_op_s
        algbw = [p.nbytes / s / 1e9 for s in times]
        # a step's ops each with its own kind's factor; one op kind otherwise
        busbw = [p.bus_bytes(world, op) / s / 1e9 for s in times] if world else []
        blocking_us = [s * 1e6 for s in p.blocking_s]
        graph = [s / p.burst * 1e6 for s in p.graph_s] if p.graph_s else []
        if experiment == "nccl_burst":
            step, figs = None, {"burst_ms": [s * 1e3 for s in q], "queued_op_us": [s * 1e6 for s in per_op_s],
                                "op_us_p50": blocking_us, "op_us_mean": blocking_us,
                                "graph_burst_ms": [s * 1e3 for s in (p.graph_s or [])]}
            figs.update({f"{k.replace('_', '')}_ms_per_step": [s * 1e3 for s in v]
                         for k, v in p.queued_kind_s.items()})
        elif experiment == "allreduce_sweep":
            step, figs = p.nbytes, {"time_us": [s * 1e6 for s in per_op_s], "blocking_us_p50": blocking_us,
                                    "time_us_graph": graph}
        else:
            step, figs = p.label, {"a2a_us": [s * 1e6 for s in per_op_s],
                                   "a2a_us_per_token": [s * 1e6 / p.label for s in per_op_s],
                                   "a2a_blocking_us_p50": blocking_us, "a2a_us_graph": graph}
        figs.update(algbw_gbps=algbw, busbw_gbps=busbw)
        out.update({(k, step): v for k, v in figs.items() if v})
    return out


def gemm_samples(jsonl: Path) -> Samples:
    return {(r["figure"], r["step"]): r["samples_us"] for r in _records(jsonl)}


# Readers of a fetched folder, named by the experiment schemas' `samples` hooks
# (k25exp.config.experiments): reader(folder, experiment) -> Samples.

def macro_folder(d: Path, experiment: str = "macro") -> Samples:
    return serving_samples(d / "requests.jsonl")


def spec_decode_folder(d: Path, experiment: str = "spec_decode") -> Samples:
    base = d / "baseline" / "requests.jsonl"
    return {**serving_samples(d / "spec" / "requests.jsonl"),
            **(serving_samples(base, "baseline/") if base.exists() else {}),
            **spec_point_samples(d)}


def spec_point_samples(d: Path) -> Samples:
    """The per-point figures (`[k<k>/]a<α>/{spec,base,sync}_tpot_ms_med` at step = concurrency, the
    medians over rounds of each round's TPOT p50): every round's requests of the point pooled
    (round 1's in spec/, baseline/, baseline_sync/; the others' in rounds/, named by round,
    server and α: k25exp.runners.spec_decode). One sample per request, as for a level."""
    cfg_path = d / "config.resolved.yaml"
    if not cfg_path.exists():
        return {}
    import yaml

    exp = yaml.safe_load(cfg_path.read_text()).get("experiment", {})
    alphas = exp.get("alphas") if exp.get("acceptance") == "synthetic" else None
    from k25exp.config.experiments.serving import draft_order, spec_point_name, spec_server_name

    multi = bool(exp.get("draft_lengths"))
    # (point name, server folder's name, acceptance): k3/a0.7, spec_k3, a0.7 with draft_lengths
    names = [(spec_point_name(a, k if multi else None), spec_server_name(k, multi),
              spec_point_name(a)) for k in draft_order(exp.get("num_speculative_tokens"),
                                                       exp.get("draft_lengths"))
             for a in (alphas or [None])]
    rounds = d / "rounds"

    def pooled(files: list[Path]) -> dict[int, list[float]]:
        recs = [r for f in files if f.exists() for r in _records(f)
                if r.get("phase") == "sweep" and r.get("ok") and r.get("tpot_s") is not None]
        out: dict[int, list[float]] = {}
        for r in recs:
            out.setdefault(r["level"], []).append(r["tpot_s"] * 1e3)
        return out

    def folders(server: str) -> list[Path]:  # round 1's folder, then the other rounds'
        extra = sorted(rounds.glob(f"r*_{server}/requests.jsonl")) if rounds.is_dir() else []
        return [d / server / "requests.jsonl", *extra]

    out: Samples = {}
    base = pooled(folders("baseline"))
    sync = pooled(folders("baseline_sync"))
    for i, (name, server, acc) in enumerate(names):
        a = "" if acc == "model" else f"_{acc}"
        # round 1's spec/ holds the first k's first α only; the others are rounds/r1_<server>_a<α>
        files = ([d / "spec" / "requests.jsonl"] if i == 0 else []) + (
            sorted(rounds.glob(f"r*_{server}{a}/requests.jsonl")) if rounds.is_dir() else [])
        for fig, by_level in (("spec_tpot_ms_med", pooled(files)), ("base_tpot_ms_med", base),
                              ("sync_tpot_ms_med", sync)):
            out.update({(f"{name}/{fig}", c): v for c, v in by_level.items()})
    return out


def gemm_folder(d: Path, experiment: str = "gemm") -> Samples:
    return gemm_samples(d / "samples.jsonl")


def collective_folder(d: Path, experiment: str) -> Samples:
    return collective_samples(d / "raw", experiment)


Reader = Callable[[Path, str], Samples]


def source(experiment: str) -> Optional[tuple[tuple[str, ...], Reader]]:
    """(artifact paths to fetch, reader of the fetched folder) the experiment's schema names;
    None when it keeps no samples compare reads."""
    from hydra.utils import get_method

    from k25exp.config.experiments import EXPERIMENT_SCHEMAS

    schema = EXPERIMENT_SCHEMAS.get(experiment)
    if schema is None or not schema.samples:
        return None
    reader = get_method(schema.samples)
    return schema.sample_artifacts, lambda d: reader(d, experiment)


def why_no_samples(experiment: str, metric: str, samples_found: bool, problem: str = "") -> str:
    """The note a figure without samples carries instead of a test."""
    if problem:
        return f"no samples ({problem})"
    from k25exp.config.experiments import EXPERIMENT_SCHEMAS

    schema = EXPERIMENT_SCHEMAS.get(experiment)
    if schema is not None and schema.no_samples:
        return schema.no_samples
    if TAIL.search(metric) and samples_found:
        return "not tested (tail percentile: samples test the median)"
    if schema is None or not schema.samples:  # as source() finds, without loading its reader
        return f"no samples ({experiment} keeps none that compare reads)"
    return "no samples (summary figure)"
