"""spec_profile: the profile experiment on the speculative server and on its baselines.

Captures, each the profile runner's (warm-up, the level without the profiler, the capture and
its breakdown), on the servers spec_decode measures (k25exp.runners.spec_decode.servers):
  spec           vLLM's --speculative-config built from experiment.*; at acceptance=synthetic
                 started at α = START_ALPHA whatever the job's, the job's one α of
                 experiment.alphas set through its workers before the capture (the CPU
                 build's synthetic sampler is k25exp's port, installed there:
                 k25exp.serving.spec_acceptance), so a sweep over α and concurrency with
                 experiment.baselines=[] runs on one server start
  baseline       the same server without it                       (experiment.baselines)
  baseline_sync  the baseline with --no-async-scheduling          (experiment.baselines)
Each decode step's cycle is split by vLLM's scopes into verification, sampler, drafter,
bookkeeping and host gap (k25exp.traces.step_phases); with both baselines the spec cycle's
excess over the baseline's is split into scheduling, verification, sampler, drafter and host
(gap_split), per step and per emitted token (÷ the expected tokens per step at α).
Logged: the spec capture's figures under the profile's names, the baselines' under
`baseline/` and `baseline_sync/`, the split as `gap_<part>_ms`. Artifacts: one folder each.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from k25exp.config.experiments import SpecProfileConfig
from k25exp.config.schema import K25Config
from k25exp.runners import profile
from k25exp.runners.server_run import connect_server
from k25exp.runners.spec_decode import PREFIX, servers
from k25exp.serving import server as srv_mod
from k25exp.serving.spec_acceptance import expected_tokens, set_in_server, unconditional_rates
from k25exp.serving.speculative import describe, speculative_config
from k25exp.traces.step_phases import gap_split, schedules_as_baseline
from k25exp.tracking.recorder import Capture, Recorder

log = logging.getLogger(__name__)

START_ALPHA = 0.5


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: SpecProfileConfig = cfg.experiment
    model_path, _ = srv_mod.resolve_model_path(cfg.server, cfg.model, cfg.seed)
    # started at one α whatever the job's (set in its workers before the capture), so jobs
    # that differ only in α or concurrency reuse one server start
    spec_json = json.dumps(speculative_config(replace(exp, alphas=[START_ALPHA]), model_path,
                                              Path(cfg.server.model_cache)), sort_keys=True)
    k = exp.num_speculative_tokens
    async_kept = schedules_as_baseline(exp.method, cfg.hardware.device)
    tags = {"spec.config": spec_json, "spec.method": exp.method,
            "spec.num_speculative_tokens": str(k), "spec.bound": describe(exp),
            "spec.acceptance": exp.acceptance,
            "spec.async_scheduling": "as the baseline's (vLLM keeps async scheduling for this "
            "method, or the CPU build runs every server without it): compared with the baseline"
            if async_kept else "off (vLLM turns it off for this method): compared with baseline_sync"}
    named = servers(cfg, spec_json, exp.baselines)
    tau = 1.0
    summary: dict[str, float] = {}
    got: dict[str, dict[str, float]] = {}
    for name, server in named.items():
        srv_cfg = replace(cfg, server=server)
        cap = Capture(rec, PREFIX[name])
        if name == "spec" and exp.acceptance == "synthetic":
            a = exp.alphas[0]
            conn = connect_server(profile.with_scopes(srv_cfg))
            sampler = set_in_server(conn.base_url, unconditional_rates(a, k))
            tags.update({"spec.alphas": f"{a:g}", "spec.sampler": sampler[0].get("sampler", "?")})
            tau = expected_tokens(a, k)
            cap.log_metrics({"spec_alpha": a, "spec_expected_tokens_per_step": tau})
        log.info("spec_profile: the %s server", name)
        got[name] = profile.run(srv_cfg, out / name, cap)
        summary.update({PREFIX[name] + m: v for m, v in got[name].items()})
    rec.set_tags(tags)
    if "baseline" in got:
        try:
            split = gap_split(got["spec"], got["baseline"], got.get("baseline_sync"), async_kept)
        except KeyError as e:  # a capture without phases (scopes off): the captures stay
            log.warning("no gap split: %s", e)
            rec.set_tags({"gap_split.skipped": f"{e}"})
        else:
            figs = {f"gap_{p}_ms": v for p, v in split.items()}
            figs["spec_cycle_per_token_ms"] = got["spec"]["phase_cycle_ms"] / tau
            figs["profiled_speedup"] = got["baseline"]["phase_cycle_ms"] * tau / got["spec"]["phase_cycle_ms"]
            rec.log_metrics(figs)
            rec.set_tags({"gap_split.definition": gap_split.__doc__.split("Raises")[0].strip()})
            summary.update(figs)
    return summary
