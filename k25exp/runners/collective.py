"""What the three collective runners share: launching the worker and reading its results."""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Optional

from k25exp import tables, vllm_kernels
from k25exp.collectives import nccl_log
from k25exp.collectives.launch import LaunchOutcome, Topology, launch
from k25exp.collectives.results import RankFiles, read_rank_files
from k25exp.collectives.spec import CollectiveSpec, Point
from k25exp.config.experiments import CollectiveExperiment
from k25exp.config.schema import K25Config
from k25exp.serving.errors import ServerError
from k25exp.serving.launch import threads_bind
from k25exp.tracking.recorder import Recorder


class CollectiveFailed(RuntimeError):
    """The collective run failed; whatever finished was logged before this was raised."""


# Set by replaying(): measure() reads what the ranks already wrote instead of launching them
# (recovering a killed job's run computes its figures with this same runner code).
_replay = contextvars.ContextVar("k25exp_collective_replay", default=False)


@contextlib.contextmanager
def replaying() -> Iterator[None]:
    token = _replay.set(True)
    try:
        yield
    finally:
        _replay.reset(token)


def _replayed(raw: Path) -> LaunchOutcome:
    """A launch that was killed: what torchrun.log holds is its tail."""
    log_file = raw / "torchrun.log"
    tail = log_file.read_text(errors="replace").splitlines()[-40:] if log_file.exists() else []
    return LaunchOutcome(returncode=-9, seconds=0.0, log_tail=tail)


def timing_tags(spec: CollectiveSpec) -> dict[str, str]:
    graph = ("CUDA graph of the burst (captured after 3 eager bursts on a side stream), "
             f"{max(1, spec.warmup)} warm-up replay(s), then each replay timed; host clock "
             "around replay + sync") \
        if spec.graph else "off" + (" (CPU: no graphs)" if spec.device == "cpu" else "")
    if spec.communicator == "vllm" and spec.device == "cpu":
        # vLLM's CPU ops return when done (no work handles): nothing is queued behind another
        issue = ("a burst of ops run one after another (vLLM's CPU ops return when done; "
                 "each op's start and end kept, the step's burst split into wait and "
                 "transport at each op's last arrival over the ranks)")
    else:
        issue = "a burst of ops issued back to back, one wait/sync at the end"
    return {
        "communicator": spec.communicator,
        "timing.timer": "host time.perf_counter_ns on every rank; each sample = slowest rank",
        "timing.queued": f"barrier, then {issue}; per-op = burst / burst length (nccl-tests' time)",
        "timing.blocking": "barrier, one op, wait + device sync; per-op latency"
                           if spec.blocking else "off",
        "timing.graph": graph,
        "timing.warmup_bursts": str(spec.warmup),
        "timing.check": "one op on fresh inputs before timing, exact comparison on every rank"
                        if spec.check else "off",
    }


def env_tags(files: RankFiles) -> dict[str, str]:
    if not files.env:
        return {}
    e0 = files.env[0]
    cpus = {e["rank"]: e.get("cpus") for e in files.env if e.get("cpus") is not None}
    tags = {
        "device_names": ",".join(sorted({e["device_name"] for e in files.env})),
        "hosts": ",".join(sorted({e["host"] for e in files.env})),
        "world_size": str(files.world_size),
        "backend": e0["backend"],
        "worker_torch": e0["torch"],
        "worker_threads": str(e0["threads"]),
    }
    if e0.get("nccl_env"):
        tags["nccl_env"] = " ".join(f"{k}={v}" for k, v in e0["nccl_env"].items())
    if e0.get("nccl"):
        tags["nccl_version"] = e0["nccl"]
    if e0.get("cuda"):
        tags["cuda_version"] = e0["cuda"]
    if e0["backend"] == "gloo":
        tags["gloo_version"] = f"bundled with torch {e0['torch']}"
        tags["rank_cpus"] = ", ".join(f"rank{r}: {','.join(map(str, c))}" for r, c in sorted(cpus.items()))
    isa = {e["rank"]: e["vllm_cpu_isa"] for e in files.env if "vllm_cpu_isa" in e}
    if isa:  # vLLM's kernel build, per rank: one value when they agree
        tags["vllm.cpu_isa"] = (next(iter(isa.values())) if len(set(isa.values())) == 1 else
                                ", ".join(f"rank{r}: {v}" for r, v in sorted(isa.items())))
    return tags


def make_spec(cfg: K25Config, op: str, points: list[Point]) -> CollectiveSpec:
    exp: CollectiveExperiment = cfg.experiment
    if exp.limit_points is not None:
        points = points[: exp.limit_points]
    return CollectiveSpec(
        op=op, dtype=exp.dtype, device=cfg.hardware.device, backend=cfg.hardware.backend,
        points=points, warmup=exp.warmup, check=exp.check_results, blocking=exp.blocking,
        graph=exp.graph and cfg.hardware.device == "cuda", pg_timeout_s=exp.pg_timeout_s,
        fault_kill_rank=exp.fault.kill_rank, fault_at_point=exp.fault.at_point,
        fault_corrupt_rank=exp.fault.corrupt_rank, communicator=exp.communicator,
        rank_cpus=rank_cpus(cfg),
    )


def rank_cpus(cfg: K25Config) -> Optional[list[list[int]]]:
    """CPU: each local rank's CPUs as the CPU-build server binds its TP workers
    (hardware.cpu_threads_bind, which server.cpu_threads_bind follows: "split" gives each an
    equal block of this process's CPUs, or explicit lists "0,1|2,3"; a collective job has no
    server group), so the collectives are timed with the placement the server's
    run with (unbound, a rank and gloo's threads migrate between cores: on 2 cores the step's
    gloo burst read 10.7 ms where the server's profile held 7.9 ms of transport).
    None on CUDA, when unbound, or with fewer CPUs than ranks."""
    hw, bind = cfg.hardware, cfg.hardware.cpu_threads_bind
    if hw.device != "cpu" or not bind:
        return None
    try:
        text = threads_bind(bind, hw.nproc_per_node)
    except ServerError:  # more ranks than CPUs: nothing to bind them to one each
        return None
    blocks = [[int(x) for x in b.split(",")] for b in text.split("|")]
    return blocks if len(blocks) == hw.nproc_per_node else None


def rank_env(hw) -> dict[str, str]:
    """The environment every rank gets on top of this process's: hardware.env and the
    settings hardware fields stand for."""
    env = {k: str(v) for k, v in hw.env.items()}
    if not hw.nccl_p2p:
        env["NCCL_P2P_DISABLE"] = "1"
    if hw.vllm_cpu_isa:
        env.update(vllm_kernels.child_env(hw.vllm_cpu_isa))
    return env


def measure(cfg: K25Config, spec: CollectiveSpec, out: Path, rec: Recorder) -> tuple[RankFiles, LaunchOutcome]:
    hw = cfg.hardware
    rec.set_tags(timing_tags(spec))
    topo = Topology(nproc_per_node=hw.nproc_per_node, nnodes=hw.nnodes, node_rank=hw.node_rank,
                    rdzv_endpoint=hw.rdzv_endpoint, env=rank_env(hw))
    replay = _replay.get()
    if not replay and spec.backend == "nccl":
        rec.set_tags(nccl_choice_tags(spec, topo, out, cfg.experiment.wall_limit_s)
                     if cfg.experiment.nccl_probe else {"nccl.choice": "not probed (experiment.nccl_probe=false)"})
    outcome = _replayed(out / "raw") if replay else \
        launch(spec, topo, out / "raw", wall_limit_s=cfg.experiment.wall_limit_s)
    files = read_rank_files(out / "raw")
    rec.set_tags(env_tags(files))
    impls = {p.impl.get("impl") for p in files.points if p.impl.get("impl")}
    if impls:  # what the communicator picked (vLLM: shm, custom all-reduce, pynccl, ...)
        rec.set_tags({"communicator.impl": "; ".join(sorted(impls))[:4000]})
    rec.log_metrics({"points_measured": len(files.points)} if replay else
                    {"torchrun_s": outcome.seconds, "points_measured": len(files.points)})
    return files, outcome


NCCL_CHOICE_COLUMNS = [tables.Column("op", width=14), tables.Column("bytes", width=12),
                       tables.Column("algo", width=16), tables.Column("proto", width=8),
                       tables.Column("channels", width=10), tables.Column("calls", width=7)]


def nccl_choice_tags(spec: CollectiveSpec, topo: Topology, out: Path,
                     wall_limit_s: Optional[float]) -> dict[str, str]:
    """What NCCL chose for each point (algorithm, protocol, channels), from its own log in a
    separate untimed probe job (its per-op logging would slow the timed one). Skipped, saying
    so, where the user set NCCL_DEBUG themselves; the table goes to nccl_choices.txt."""
    if "NCCL_DEBUG" in (topo.env or {}):
        return {"nccl.choice": "not probed (hardware.env sets NCCL_DEBUG: its log is the user's)"}
    folder = out / "nccl_probe"
    folder.mkdir(parents=True, exist_ok=True)
    env = {**(topo.env or {}), **nccl_log.probe_env(folder.resolve())}
    probe = launch(nccl_log.probe_spec(spec), replace(topo, env=env), folder, wall_limit_s=wall_limit_s)
    logged, channels, n_logs = nccl_log.read_logs(folder)
    choices = nccl_log.only_measured(logged, spec)
    if not choices:
        if not probe.ok:
            why = f"torchrun exited {probe.returncode}"
        elif not logged:
            why = f"no TUNING lines in {n_logs} rank log(s) (a 1-rank communicator makes no choice)"
        else:
            why = (f"NCCL logged no choice for the measured {spec.op} (it runs as send/recv pairs, "
                   "which log none)" if spec.op == "all_to_all" else
                   f"NCCL logged no choice at the measured {spec.op} sizes")
            why += "; the worker's own ops (barriers, gathering results): " + nccl_log.summary(logged)
        return {"nccl.choice": f"unknown: {why}"[:5000]}
    rows = nccl_log.table(choices)
    print(tables.write(out / "nccl_choices", NCCL_CHOICE_COLUMNS, rows,
                       "What NCCL chose (its TUNING log, untimed probe job)"), flush=True)
    return {"nccl.choice": nccl_log.summary(choices)[:5000],
            "nccl.coll_channels": str(channels) if channels is not None else "unknown",
            "nccl.choice_source": "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING, separate probe job "
                                  "(one burst per point, not timed)"}


def finish(out: Path, columns, rows, title: str, spec: CollectiveSpec, files: RankFiles,
           outcome: LaunchOutcome) -> None:
    """Write and print the result table (finished points only), then raise if the run failed."""
    print(tables.write(out / "results", columns, rows, title), flush=True)
    if msg := failure_message(spec, files, outcome):
        raise CollectiveFailed(msg)


def failure_message(spec: CollectiveSpec, files: RankFiles, outcome: LaunchOutcome) -> Optional[str]:
    """Why the run failed, naming rank and size where known; None if it did not."""
    for p in files.points:
        if p.wrong:
            d = p.wrong_detail[0]
            return (f"wrong {d.get('wrong_op', spec.op)} result on rank {d['rank']} at "
                    f"{d.get('wrong_bytes', p.nbytes)} B "
                    f"(point {p.index}, label {p.label}): {d['wrong']} of {p.numel} elements "
                    f"wrong, first at index {d.get('first_wrong_index')}: got {d.get('got')}, "
                    f"expected {d.get('expected')}")
    if outcome.ok:
        return None
    done = f"{len(files.points)} of {len(spec.points)} points finished"
    if files.faults:
        f = files.faults[0]
        return f"rank {f['rank']} died at point {f['point']} (injected fault); {done}"
    if outcome.timed_out:
        return f"torchrun exceeded experiment.wall_limit_s={outcome.wall_limit_s:g} s; {done}"
    tail = "\n".join(outcome.log_tail[-15:])
    return f"torchrun exited with code {outcome.returncode}; {done}. Last output:\n{tail}"


def recover(out: Path, run) -> str:
    """A killed job's figures (`k25exp recover`): the runner itself, replayed on raw/ instead of
    launching torchrun: the same result aggregation (k25exp.collectives.results), metrics,
    results table and plots."""
    from k25exp.config.validate import typed_from_folder
    from k25exp.runners import runner_for

    if not any((out / "raw").glob("rank*.jsonl")):
        return "nothing: no rank's samples in raw/"
    cfg = typed_from_folder(out)
    try:
        with replaying():
            runner_for(cfg.experiment)(cfg, out, run)
    except CollectiveFailed:
        pass  # expected: the sweep did not finish; what did is logged
    files = read_rank_files(out / "raw")
    return (f"{cfg.experiment.name}: {len(files.points)} finished point(s) from raw/ "
            f"({files.incomplete_points} incomplete dropped) by the runner's own figure code "
            "(torchrun not relaunched): metrics, results.txt/.csv, plots/")
