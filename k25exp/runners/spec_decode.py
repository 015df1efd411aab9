"""spec_decode: speculative decoding against its own baselines, at a configured acceptance,
each point measured `spec_repeats` times on fresh server starts.

The servers, identical except for what is named (argument lists, k25exp.serving):
  spec           vLLM's --speculative-config built from experiment.* (k25exp.serving.speculative);
                 with acceptance=synthetic it starts in vLLM's synthetic rejection mode and each α
                 of experiment.alphas is set in its workers between measurements
                 (k25exp.serving.spec_acceptance): one start serves every α
  baseline       the same server without it (vLLM's own scheduling choice: async where it can)
  baseline_sync  the baseline with --no-async-scheduling (experiment.baseline_sync): the
                 scheduling of a spec server whose drafter turns async scheduling off
Each is measured by the macro runner (warm-up, single stream, each concurrency: its figures and
definitions). With spec_repeats > 1 every round starts every server afresh and the order is
reversed every other round (S B B' | B' B S | ...), so the spread of a point holds what a rerun
moves (start-to-start differences, drift), and each round's speedup pairs servers measured
minutes apart. With experiment.baseline_beside a baseline start goes before and after every
other server (B S3 B S1 B S5 B): each speculative measurement is paired with the mean of the
two baselines next to it, so a machine that drifts over the round (a 2-core CPU moved 20 %
within minutes) moves both sides of a speedup alike.

Logged: round 1's (first α's) figures under their macro names (speculative server), under
`baseline/` and `baseline_sync/`; per point (k25exp.runners.spec_decode_results) the median over
rounds and spread, the speedup's median, min–max and bootstrap interval, at step = concurrency,
named by acceptance (`a0.7/…`, `model/…`; `k3/a0.7/…` with draft_lengths). The server left
running is the last measured, so a sweep over speculative settings reuses the baseline when it
is still up (spec_repeats = 1).
Artifacts: spec/, baseline/, baseline_sync/ (round 1's macro files), rounds/ (the others',
r<round>[s<slot>]_<server>[_a<α>], the server spec_k<k> with draft_lengths, s<slot> for a baseline
beside a later server), points.csv (one row per
server, k, α, round and level), results.txt/.csv (the points). A job stopped part-way (Ctrl-C,
a GPU stage's time limit, a server that died) writes them for what it measured before it ends,
the measurement it was in up to its last finished level.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

from k25exp.config.experiments import SpecDecodeConfig
from k25exp.config.experiments.serving import spec_server_name
from k25exp.config.schema import K25Config, ServerConfig
from k25exp.model import routing
from k25exp.runners import macro
from k25exp.runners.server_run import connect_server
from k25exp.runners.spec_decode_results import Measured, summarise
from k25exp.serving import server as srv_mod
from k25exp.serving.registry import release
from k25exp.serving.spec_acceptance import set_in_server, unconditional_rates
from k25exp.serving.speculative import describe, speculative_config
from k25exp.tracking.recorder import Capture, MemoryRecorder, Recorder

log = logging.getLogger(__name__)

PREFIX = {"spec": "", "baseline": "baseline/", "baseline_sync": "baseline_sync/"}


def servers(cfg: K25Config, spec_json: str, baselines: Sequence[str]) -> dict[str, ServerConfig]:
    """The speculative server and the `baselines` (baseline, baseline_sync) by name (module
    docstring)."""
    out = {"spec": replace(cfg.server, extra_args=[*cfg.server.extra_args,
                                                   "--speculative-config", spec_json])}
    if "baseline" in baselines:
        out["baseline"] = cfg.server
    if "baseline_sync" in baselines:
        out["baseline_sync"] = replace(cfg.server, extra_args=[*cfg.server.extra_args,
                                                               "--no-async-scheduling"])
    return out


def rounds_order(names: list[str], repeats: int, baseline_first: bool,
                 beside: bool = False) -> list[list[str]]:
    """Each round's order: reversed every other round, so no server always goes first. In
    round 1 the baseline goes first when it is already running (one start fewer), else last,
    so a sweep's next job finds it running. `beside`: a baseline start before and after every
    other server (B S3 B S1 B S5 B), so each is paired with baselines measured next to it."""
    first = [n for n in names if n != "baseline"]
    if beside and "baseline" in names:
        first = ["baseline", *(x for n in first for x in (n, "baseline"))]
    elif "baseline" in names:
        first = ["baseline", *first] if baseline_first else [*first, "baseline"]
    return [first if r % 2 == 0 else first[::-1] for r in range(repeats)]


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: SpecDecodeConfig = cfg.experiment
    if exp.acceptance == "synthetic":  # each request draws its own acceptance (request_seed)
        exp = replace(exp, request_seed=False)
        cfg = replace(cfg, experiment=exp)
    model_path, _ = srv_mod.resolve_model_path(cfg.server, cfg.model, cfg.seed)
    ks, multi = exp.k_values(), bool(exp.draft_lengths)
    spec_json = {k: json.dumps(speculative_config(replace(exp, num_speculative_tokens=k), model_path,
                                                  Path(cfg.server.model_cache)), sort_keys=True)
                 for k in ks}
    alphas: list[Optional[float]] = list(exp.alphas) if exp.acceptance == "synthetic" else [None]
    rec.set_tags({"spec.config": spec_json[ks[0]], "spec.method": exp.method,
                  "spec.num_speculative_tokens": ",".join(map(str, ks)),
                  "spec.bound": describe(exp), "spec.acceptance": exp.acceptance,
                  "spec.alphas": ",".join(f"{a:g}" for a in exp.alphas)
                  if exp.acceptance == "synthetic" else "as the drafter achieves",
                  "spec.repeats": f"{exp.spec_repeats} round(s), every server started afresh "
                  "each round, the order reversed every other round" if exp.spec_repeats > 1
                  else "1 round",
                  "spec.speedup_definition": "baseline TPOT p50 / speculative TPOT p50 at one "
                  "level, paired by round (same prompts, servers measured minutes apart); "
                  "median over rounds, min-max, bootstrap 95 % interval of the median"})
    if multi:
        rec.set_tags({"spec.draft_lengths": f"k = {', '.join(map(str, ks))}: one speculative "
                      "server each, interleaved with the baselines in every round; points "
                      "named k<k>/a<α>/…"})
    base = servers(cfg, spec_json[ks[0]], [n for n, on in (("baseline", exp.baseline), (
        "baseline_sync", exp.baseline and exp.baseline_sync)) if on])
    named = {spec_server_name(k, multi): servers(cfg, spec_json[k], [])["spec"] for k in ks}
    named.update({n: c for n, c in base.items() if n != "spec"})
    k_of = {spec_server_name(k, multi): k for k in ks}
    plan = rounds_order(list(named), exp.spec_repeats,
                        baseline_first=exp.baseline and _running(cfg, model_path),
                        beside=exp.baseline_beside)
    measured: list[Measured] = []
    summary: dict[str, float] = {}
    last = (len(plan) - 1, len(plan[-1]) - 1)
    headline = {spec_server_name(ks[0], multi), "baseline", "baseline_sync"}  # round 1's macro names
    try:
        for r, order in enumerate(plan):
            for slot, name in enumerate(order):
                srv_cfg = replace(cfg, server=named[name])
                kind = "spec" if name in k_of else name
                again = name in order[:slot]  # a baseline beside a later server: its own folder
                for a in (alphas if kind == "spec" else [None]):
                    first = r == 0 and (a is None or a == alphas[0]) and name in headline and not again
                    cap = Capture(rec if first else MemoryRecorder(), PREFIX[kind] if first else "")
                    folder = out / kind if first else out / "rounds" / (
                        f"r{r + 1}{f's{slot}' if again else ''}_{name}" + ("" if a is None else f"_a{a:g}"))
                    conn = None
                    if a is not None:  # the server up (started or reused), then α in its workers
                        conn = connect_server(srv_cfg)
                        got = set_in_server(conn.base_url, unconditional_rates(a, k_of[name]))
                        rec.set_tags({"spec.sampler": got[0].get("sampler", "?")})
                    log.info("spec_decode: round %d, %s server%s", r + 1, name,
                             "" if a is None else f", α = {a:g}")
                    # listed before it runs: a job stopped inside it keeps its finished levels
                    measured.append(Measured(kind, a, r + 1, cap, k=k_of.get(name), slot=slot))
                    res = macro.run(srv_cfg, Path(folder), cap)
                    if conn is not None and conn.started:  # started here, before the macro reused it
                        started = {"server_starts": 1.0, "server_start_s": conn.start_s}
                        cap.log_metrics(started)
                        res.update(started)
                    if first:
                        summary.update({PREFIX[kind] + k: v for k, v in res.items()})
                if (r, slot) != last and (exp.spec_repeats > 1 or exp.baseline_beside):
                    _stop(srv_cfg, model_path)  # the next time it runs, it starts afresh
    except BaseException:  # a stop (SIGINT, a stage's time limit) or a failure
        if measured:  # every point measured so far, paired where its baseline was measured
            log.warning("spec_decode stopped during measurement %d of the plan: the points "
                        "measured so far are in points.csv and results.txt", len(measured))
            try:
                summarise(exp, measured, out, rec)
            except Exception:  # never hides why the job stopped
                log.exception("spec_decode: the points measured so far could not be summarised")
        raise
    summary.update(summarise(exp, measured, out, rec))
    return summary


def _launch_key(cfg: K25Config, model_path: Path) -> Optional[str]:
    try:
        return srv_mod.launch_spec(cfg.server, model_path, cfg.hardware.device, cfg.tracking.redact,
                                   cfg.hardware.vllm_cpu_isa, routing.of_config(cfg)).key()
    except srv_mod.ServerError:
        return None


def _running(cfg: K25Config, model_path: Path) -> bool:
    """Whether the baseline's server (same launch) is already up in this process."""
    key = _launch_key(cfg, model_path) if cfg.server.kind == "vllm" else None
    return key is not None and any(s.key == key for s in srv_mod.running())


def _stop(cfg: K25Config, model_path: Path) -> None:
    key = _launch_key(cfg, model_path)
    for s in srv_mod.running():
        if s.key == key:
            release(s)
