"""The trace experiments (phase 3): a torch.profiler capture of the live server's decode broken
down per step (profile), and the same analysis of traces you already have (trace_breakdown)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, List, Optional

from omegaconf import MISSING

from k25exp.config.dev_endpoints import dev_endpoint_problems
from k25exp.config.experiments.base import ExperimentBase, experiment, positive
from k25exp.config.experiments.speculative import SpeculativeSettings
from k25exp.config.experiments.serving import INPUT_TOKENS, OUTPUT_TOKENS, ROUNDS, level_requests

if TYPE_CHECKING:
    from k25exp.config.schema import K25Config


@experiment
@dataclass
class ProfileConfig(ExperimentBase):
    """Phase 3: a torch.profiler capture of the live server's decode, broken down by kernel.

    warmup = requests before the profile window; requests = decode requests inside it;
    limit_points = analyse only the first N decode steps of each rank.
    """

    recover: ClassVar[Optional[str]] = "k25exp.runners.profile.recover"
    no_samples: ClassVar[str] = "no samples (shares of one capture)"

    campaign_order: ClassVar[Optional[int]] = 6
    headline: ClassVar[tuple[str, ...]] = ("decode_step_ms", "share_communication", "share_gemm", "share_moe",
                                           "share_attention")
    headline_params: ClassVar[tuple[str, ...]] = ("experiment.concurrency",)
    # spans the macro sweep; one server start (reused across the levels)
    campaign_sweep: ClassVar[str] = "experiment.concurrency=1,8,32"

    name: str = "profile"
    _target_: str = "k25exp.runners.profile.run"
    warmup: int = 2
    requests: int = 4  # decode requests inside the profile window (at least concurrency are sent)
    concurrency: int = 1  # the batch being profiled (at least this many requests are sent)
    # The macro's request shape (its defaults): the report takes this step for the macro's.
    input_tokens: int = INPUT_TOKENS  # prompt length of the profiled requests
    output_tokens: int = OUTPUT_TOKENS  # tokens each generates (at least 2: the decode steps)
    temperature: float = 0.0  # sampling temperature (0 = greedy)
    # The level without the profiler first (this server start's own speed, unprofiled_tpot_*):
    # a closed loop of max(8, reference_rounds × concurrency) requests, as the macro sends a
    # level by default, so its TPOT holds the same refill prefills as the macro's; 0 = off.
    reference_rounds: int = ROUNDS
    # One round of the level (concurrency requests, all in flight) before that reference, as
    # the macro's level_warmup: a server's first batch of a shape does one-time work. On an
    # H100 (the Kimi rank, EAGLE-3 k = 3, α 0.7, c = 4) the reference of a fresh start read a
    # TPOT of 7.18 ms against 3.45-3.77 ms in spec_decode's warmed levels.
    level_warmup: bool = True
    seed: int = MISSING  # conf/experiment_base/serving.yaml: the root's
    # /stop_profile blocks while every rank flushes its trace (minutes with stack capture).
    stop_timeout_s: float = 900.0
    # Where the server writes traces: its profiler config's torch_profiler_dir (launched
    # server); for server=endpoint, a folder this machine can read.
    trace_dir: Optional[str] = None
    trace_glob: str = "*.pt.trace.json*"  # the trace files in trace_dir (one per rank)
    rules: Optional[str] = None  # classification rules YAML; null = conf/trace_rules/default.yaml
    top_kernels: int = 30  # kernels listed in top_kernels.csv, by time
    # After the capture, the step's collectives (2 × layers + 2 at tokens = concurrency) timed
    # inside the server's own TP workers (k25exp.serving.collective_probe): this many bursts
    # after 5 warm-up ones; 0 = off. Needs the probe loaded (server.collective_probe, TP > 1).
    server_burst_reps: int = 50

    def reference_requests(self) -> int:
        """Requests of the level without the profiler: reference_rounds rounds of its
        concurrency, at least the macro's minimum (as the macro sends a level by default)."""
        return level_requests(self.reference_rounds, self.concurrency)

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """The capture and what it needs of its server: a profiler config (the server group's
        own checks: k25exp.config.server_checks, for every experiment with a server)."""
        super().check(cfg, problems)
        positive(self, "experiment", ["requests", "concurrency", "input_tokens", "stop_timeout_s",
                                      "top_kernels"], problems)
        if self.reference_rounds < 0:
            problems.append(f"experiment.reference_rounds={self.reference_rounds}: expected >= 0 "
                            "(0 = no level without the profiler)")
        if self.server_burst_reps < 0:
            problems.append(f"experiment.server_burst_reps={self.server_burst_reps}: expected >= 0 "
                            "(0 = no in-server burst)")
        if self.output_tokens < 2:
            problems.append(f"experiment.output_tokens={self.output_tokens}: expected >= 2 (a decode step "
                            "needs a token after the first)")
        prof = cfg.server.profiler or {}
        if cfg.server.kind == "vllm":
            d = prof.get("torch_profiler_dir")
            if prof.get("profiler") != "torch" or not d or not str(d).startswith("/"):
                problems.append(f"server.profiler={dict(prof) or None}: experiment=profile needs "
                                "{profiler: torch, torch_profiler_dir: <absolute folder>}")
        elif not self.trace_dir:
            problems.append("experiment.trace_dir: required with server=endpoint (the folder where that "
                            "server's --profiler-config writes traces, readable from here)")
        # vLLM's dev endpoints answer without the API key: loopback only, unless opted in
        problems += dev_endpoint_problems(
            cfg.server, "experiment=profile uses /start_profile and /stop_profile")

@experiment
@dataclass
class TraceBreakdownConfig(ExperimentBase):
    """Breakdown of traces someone already has (one file per rank), logged as a run."""

    example_overrides: ClassVar[tuple[str, ...]] = ("experiment.paths=[/tmp]",)
    recover: ClassVar[Optional[str]] = "k25exp.runners.trace_breakdown.recover"
    no_samples: ClassVar[str] = "no samples (shares of given traces)"

    headline: ClassVar[tuple[str, ...]] = ("decode_step_ms", "share_communication", "share_gemm", "share_moe",
                                           "share_attention")

    name: str = "trace_breakdown"
    _target_: str = "k25exp.runners.trace_breakdown.run"
    paths: List[str] = field(default_factory=list)  # files, or folders searched for trace_glob
    trace_glob: str = "*.pt.trace.json*"  # the files searched for in folders of paths
    rules: Optional[str] = None  # classification rules YAML; null = conf/trace_rules/default.yaml
    top_kernels: int = 30  # kernels listed in top_kernels.csv, by time

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """Traces to read."""
        super().check(cfg, problems)
        if not self.paths:
            problems.append("experiment.paths=[]: expected trace files or folders, e.g. "
                            "'experiment.paths=[/data/traces]'")
        positive(self, "experiment", ["top_kernels"], problems)



@experiment
@dataclass
class SpecProfileConfig(ProfileConfig, SpeculativeSettings):
    """The profile of the speculative server: the same capture with vLLM's --speculative-config
    (the `spec=` group and experiment.* as spec_decode takes them) at one acceptance, so each
    decode step's cycle splits into verification, rejection sampler, drafter, bookkeeping and
    host gap (k25exp.traces.step_phases). Profile the baseline beside it with experiment=profile,
    and with server.extra_args=[--no-async-scheduling] for a drafter that turns async
    scheduling off: the report sets the three side by side."""

    recover: ClassVar[Optional[str]] = "k25exp.runners.profile.recover"
    campaign_order: ClassVar[Optional[int]] = None
    campaign_sweep: ClassVar[str] = ""
    headline: ClassVar[tuple[str, ...]] = ("phase_cycle_ms", "phase_verify_ms", "phase_draft_ms",
                                           "phase_sample_ms", "phase_gap_ms")

    name: str = "spec_profile"
    _target_: str = "k25exp.runners.spec_profile.run"
    alphas: List[float] = field(default_factory=lambda: [0.7])  # exactly one: the profiled α
    server_burst_reps: int = 0  # the burst is the baseline profile's business
    # The baselines captured after the spec server, at the same level (spec_decode's): the
    # server without speculation, and it without async scheduling. Both are needed for the
    # split of the spec cycle's excess (k25exp.traces.step_phases.gap_split).
    baselines: List[str] = field(default_factory=lambda: ["baseline", "baseline_sync"])

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """The capture's checks, the speculative settings', one α."""
        super().check(cfg, problems)
        self.speculative_problems(cfg, "spec_profile", problems)
        if self.acceptance == "synthetic" and len(self.alphas) != 1:
            problems.append(f"experiment.alphas={list(self.alphas)}: experiment=spec_profile profiles one "
                            "acceptance; sweep α one job each (-m 'experiment.alphas=[0.5],[0.9]')")
        bad = [b for b in self.baselines if b not in ("baseline", "baseline_sync")]
        if bad or ("baseline_sync" in self.baselines and "baseline" not in self.baselines):
            problems.append(f"experiment.baselines={list(self.baselines)}: expected a subset of "
                            "[baseline, baseline_sync], baseline_sync only beside baseline")
        if self.acceptance == "synthetic" and cfg.hardware.device == "cpu":
            # the CPU build has no synthetic sampler: k25exp's port goes in through the workers
            self.acceptance_rpc_problems(cfg, "experiment.acceptance=synthetic on the CPU build "
                                         "installs k25exp's synthetic sampler through /collective_rpc",
                                         ", or profile acceptance=as_model", problems)
