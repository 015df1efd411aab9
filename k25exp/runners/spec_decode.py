"""spec_decode: the macro measurement on a speculative-decoding server and on its baseline.

Two servers with identical settings except vLLM's --speculative-config (built by
k25exp.serving.speculative) are measured one after the other by the macro runner: warm-up,
single stream (batch 1), then each concurrency. Metrics of the speculative server are logged
under their macro names, with the server's acceptance counters per level (acceptance_rate,
mean_accepted_tokens, acceptance_pos<i>: k25exp.serving.server_metrics); the baseline's
under `baseline/<name>`. The comparison, at the same client definitions:

    spec_speedup               baseline single-stream TPOT p50 / speculative TPOT p50
    level_spec_speedup  (step) baseline TPOT p50 / speculative TPOT p50 at that concurrency
    level_throughput_gain (step) speculative output tok/s / baseline output tok/s

The server left running is whichever was measured last; the order is chosen so that a sweep
over speculative settings reuses the baseline server when it is still running.
Artifacts: spec/ and baseline/ (each a macro job's files), results.txt/.csv (the comparison).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from k25exp import tables
from k25exp.config.experiments import SpecDecodeConfig
from k25exp.config.schema import K25Config
from k25exp.model import routing
from k25exp.runners import macro
from k25exp.serving import server as srv_mod
from k25exp.serving.speculative import describe, speculative_config
from k25exp.tracking.recorder import Capture, Recorder

log = logging.getLogger(__name__)

COLUMNS = [
    tables.Column("conc", "{}", 6), tables.Column("base_tpot", "{:.2f}", 10),
    tables.Column("spec_tpot", "{:.2f}", 10), tables.Column("speedup", "{:.3f}", 8),
    tables.Column("base_tok/s", "{:.1f}", 11), tables.Column("spec_tok/s", "{:.1f}", 11),
    tables.Column("accept", "{:.3f}", 7), tables.Column("mean_acc", "{:.2f}", 9),
    tables.Column("valid", "{:.0f}", 6),
]


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: SpecDecodeConfig = cfg.experiment
    model_path, _ = srv_mod.resolve_model_path(cfg.server, cfg.model, cfg.seed)
    spec = speculative_config(exp, model_path, Path(cfg.server.model_cache))
    spec_json = json.dumps(spec, sort_keys=True)
    rec.set_tags({"spec.config": spec_json, "spec.method": exp.method,
                  "spec.num_speculative_tokens": str(exp.num_speculative_tokens),
                  "spec.bound": describe(exp),
                  "spec.speedup_definition": "baseline TPOT p50 / speculative TPOT p50, same "
                  "server settings, same prompts, measured in this job"})
    variants = {"spec": replace(cfg.server, extra_args=[*cfg.server.extra_args,
                                                         "--speculative-config", spec_json])}
    if exp.baseline:
        variants["baseline"] = cfg.server
    order = list(variants)
    if exp.baseline and _running(cfg, model_path):
        order = ["baseline", "spec"]  # reuse it: one server start fewer

    caps: dict[str, Capture] = {}
    summary: dict[str, float] = {}
    for name in order:
        cap = caps[name] = Capture(rec, "" if name == "spec" else "baseline/")
        log.info("spec_decode: measuring the %s server", name)
        res = macro.run(replace(cfg, server=variants[name]), out / name, cap)
        summary.update({(k if name == "spec" else f"baseline/{k}"): v for k, v in res.items()})
    if "baseline" in caps:
        summary.update(_compare(exp, caps["spec"], caps["baseline"], out, rec))
    return summary


def _running(cfg: K25Config, model_path: Path) -> bool:
    """Whether the baseline's server (same launch) is already up in this process."""
    if cfg.server.kind != "vllm":
        return False
    try:
        key = srv_mod.launch_spec(cfg.server, model_path, cfg.hardware.device,
                                  cfg.tracking.redact, cfg.hardware.vllm_cpu_isa,
                                  routing.of_config(cfg)).key()
    except srv_mod.ServerError:
        return False
    return any(s.key == key for s in srv_mod.running())


def _compare(exp: SpecDecodeConfig, spec: Capture, base: Capture, out: Path,
             rec: Recorder) -> dict[str, float]:
    summary: dict[str, float] = {}
    s1 = spec.latest("single_stream_tpot_ms").get(None)  # step None: a summary figure
    b1 = base.latest("single_stream_tpot_ms").get(None)
    if s1 and b1:
        summary["spec_speedup"] = b1 / s1
        rec.log_metrics(summary)
    rows = []
    st, bt = spec.latest("tpot_ms_p50"), base.latest("tpot_ms_p50")
    stok, btok = spec.latest("output_tok_s"), base.latest("output_tok_s")
    acc, mean_acc = spec.latest("acceptance_rate"), spec.latest("mean_accepted_tokens")
    sv, bv = spec.latest("valid"), base.latest("valid")
    for level in macro.sweep_levels(exp):
        c = macro.step_of(exp, level)  # the step both runs logged the level at
        if c not in st or c not in bt:
            continue
        m = {"level_spec_speedup": bt[c] / st[c]}
        if stok.get(c) and btok.get(c):
            m["level_throughput_gain"] = stok[c] / btok[c]
        rec.log_metrics(m, step=c)
        rows.append([level, bt[c], st[c], m["level_spec_speedup"], btok.get(c), stok.get(c),
                     acc.get(c), mean_acc.get(c), min(sv.get(c, 0), bv.get(c, 0))])
    cols = COLUMNS if exp.load == "closed" else [tables.Column("rate/s", "{:g}", 8)] + COLUMNS[1:]
    text = tables.write(out / "results", cols, rows,
                        f"spec_decode: {exp.method}, {exp.num_speculative_tokens} speculative "
                        f"tokens; TPOT p50 ms; speedup = base/spec TPOT; accept = accepted/draft "
                        f"tokens; mean_acc = accepted per verification step; single-stream "
                        f"speedup {summary.get('spec_speedup', float('nan')):.3f}")
    print(text, flush=True)
    return summary
