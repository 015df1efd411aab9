"""The serving experiments: the HTTP benchmark against a live vLLM server (macro, phase 1),
the same with speculative decoding against its baseline (spec_decode), and the highest load
that meets latency SLOs (slo_search).

Long because three schemas share the macro client's fields and each carries its checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, ClassVar, List, Optional


from omegaconf import MISSING

from k25exp.config.dev_endpoints import dev_endpoint_problems
from k25exp.config.experiments.base import Registered, experiment, non_negative, positive
from k25exp.config.experiments.request_shapes import LengthConfig, SessionConfig, TraceConfig
from k25exp.config.experiments.speculative import SpeculativeSettings
from k25exp.config.experiments.validity import ValidityConfig

if TYPE_CHECKING:
    from k25exp.config.schema import K25Config


@dataclass
class SloConfig:
    """Latency bounds a good request meets (vLLM's --goodput), in ms; null = no bound. TTFT
    and E2E are counted from the scheduled send."""

    ttft_ms: Optional[float] = None  # time to first token, from the scheduled send
    tpot_ms: Optional[float] = None  # time per output token after the first
    e2e_ms: Optional[float] = None  # scheduled send to the last token

    def bounds(self) -> dict[str, float]:
        """The bounds given, {name: ms}."""
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass
class MacroFaultConfig:
    """Test hook: SIGKILL the launched server's process group during one sweep level."""

    kill_server_at_level: Optional[int] = None  # a concurrency of experiment.concurrency
    after_requests: int = 1  # ...once this many requests of that level have finished


# One request shape for the macro and the profile: the report predicts the macro's TPOT from
# the profile's decode step, and a step's attention and KV reads grow with its context.
INPUT_TOKENS, OUTPUT_TOKENS = 128, 64
# A closed-loop level's requests: max(MIN_REQUESTS, ROUNDS × concurrency) (the profile's
# level without the profiler is sent the same way, so the report sets like against like).
ROUNDS, MIN_REQUESTS = 4, 8


def level_requests(rounds: float, level: float, min_requests: int = MIN_REQUESTS) -> int:
    """Requests a level is sent: `rounds` rounds of its `level` closed-loop workers (or
    `rounds` seconds of an open loop's `level` req/s), at least min_requests."""
    return max(min_requests, math.ceil(rounds * level))


OPEN_LOOP_CAP = 256  # requests in flight when experiment.max_concurrency is unset: a socket each


@experiment
@dataclass
class MacroConfig(Registered):
    """Phase 1: single-stream TPOT and throughput vs concurrency over the HTTP API."""

    recover: ClassVar[Optional[str]] = "k25exp.runners.macro_results.recover"
    samples: ClassVar[Optional[str]] = "k25exp.compare.samples.macro_folder"
    sample_artifacts: ClassVar[tuple[str, ...]] = ("requests.jsonl",)

    campaign_order: ClassVar[Optional[int]] = 5
    headline: ClassVar[tuple[str, ...]] = (
        "single_stream_tpot_ms", "peak_output_tok_s", "saturation_concurrency", "tpot_ms_p50",
        "ttft_ms_p50", "output_tok_s", "goodput_req_s", "valid")
    headline_params: ClassVar[tuple[str, ...]] = ("experiment.load", "server.tp", "experiment.output_tokens")
    step_headline: ClassVar[tuple[str, ...]] = ("tpot_ms_p50", "output_tok_s")
    step_axes: ClassVar[tuple[str, ...]] = ("c", "req/s", "speedup")

    name: str = "macro"  # the experiment's name: experiment=NAME selects conf/experiment/NAME.yaml
    _target_: str = "k25exp.runners.macro.run"
    input_tokens: int = INPUT_TOKENS  # prompt length (input_len's mean), counted by the served tokenizer
    output_tokens: int = OUTPUT_TOKENS  # max_tokens with ignore_eos (output_len's mean)
    # Each request's prompt and output length: fixed (the default: exactly input_tokens /
    # output_tokens) or drawn per request (k25exp.load.lengths); the drawn lengths are each
    # record's prompt_tokens_target and max_tokens.
    input_len: LengthConfig = field(default_factory=LengthConfig)
    output_len: LengthConfig = field(default_factory=LengthConfig)
    seed: int = MISSING  # conf/experiment_base/serving.yaml: the root's
    warmup: int = 2  # requests sent before anything is measured; never in the figures
    # Before each closed-loop level, one round of it (c requests, c in flight), never in the
    # figures: the first time a server runs a batch shape it does one-time work. On an H100
    # (vLLM 0.26, the Kimi rank, CUDA graphs) every speculative server (ngram_gpu k = 1, 5;
    # EAGLE-3) stalled 0.4-0.9 s in its first c = 4 level (TTFT 1.2-3.0 s, against 0.06-0.11 s
    # at its next α) and its first c = 64 level read TTFT 1.5× and a 20 % longer step; a server
    # that had run the level once (its next α) showed neither. A one-at-a-time warm-up never
    # reaches those shapes; vLLM's sweeps warm up each run at its own concurrency. Once per
    # server start and request shape in a process (tag macro.level_warmup says which levels).
    level_warmup: bool = True
    single_stream_requests: int = 8  # one at a time; 0 skips the phase
    # closed-loop levels; 1 … 32 suits two CPU cores at TP 2, a GPU box sweeps on (e.g.
    # experiment.concurrency=[1,2,4,8,16,32,64,128,256])
    concurrency: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    # The sweep's load. closed: `concurrency` workers, each sending its next request when its
    # last one ended (step = concurrency). open: requests arrive at `request_rate` req/s
    # whatever the responses do, gamma gaps of shape `burstiness` (1 = Poisson, vLLM's
    # definition), at most `max_concurrency` in flight (null: 256, the client's own cap: one
    # socket per request in flight); step = rate × 1000 (MLflow steps are integers), the rate
    # itself is the metric target_rate_req_s. trace: the requests of experiment.trace at its
    # own times divided by each experiment.trace.speedup (an open loop under the same cap);
    # step = speedup × 1000. sessions: `concurrency` multi-turn sessions in flight, each turn
    # sent on the session's history (experiment.sessions); step = concurrency.
    load: str = "closed"
    request_rate: List[float] = field(default_factory=lambda: [1.0, 2.0, 4.0])
    burstiness: float = 1.0
    max_concurrency: Optional[int] = None
    trace: TraceConfig = field(default_factory=TraceConfig)  # load=trace: the trace replayed
    sessions: SessionConfig = field(default_factory=SessionConfig)  # load=sessions: the sessions run
    # open, trace: a level whose client sent more than this fraction off the drawn schedule's rate
    # is flagged invalid (it measured the client's pace).
    max_rate_error: float = 0.05
    # open: scale each level's drawn schedule to realise request_rate exactly (n gaps are
    # otherwise about ±1/√n off the mean); the gaps' shape is kept. Not with duration_s.
    exact_rate: bool = False
    # closed: worker w starts at w × ramp_s / concurrency (0: all at once, rounds in lockstep).
    ramp_s: float = 0.0
    # Shared prefixes: request i's first prefix_tokens tokens are the prefix of group
    # i mod prefix_groups (0: every prompt its own, no shared prefix). The level logs the
    # server's prefix_cache_hit_rate.
    prefix_tokens: int = 0
    prefix_groups: int = 1
    # Goodput (vLLM's --goodput): any of slo.ttft_ms, tpot_ms, e2e_ms; a request is good when
    # it meets every one given (TTFT and E2E from the scheduled send). None set: no goodput.
    slo: SloConfig = field(default_factory=SloConfig)
    # Requests per level: a fixed count (null = max(min_requests, rounds × concurrency)),
    # or, when duration_s is set, every request due within that time of the level's start
    # (sent even when the client is late: its lateness is lag_ms).
    requests: Optional[int] = None
    rounds: int = ROUNDS
    min_requests: int = MIN_REQUESTS
    duration_s: Optional[float] = None
    # Each sweep level run this many times back to back (fresh prompts, the prefix cache reset
    # before each when reset_prefix_cache; open loop: the same drawn arrival schedule each
    # time, so the spread is the server's and the client's, not the schedule's): the level's
    # figures pool all repeats' requests;
    # <figure>_rep_min/_rep_max/_rep_spread_pct say how far the repeats' own figures differ.
    repeats: int = 1
    # Measure only the first N concurrency levels (debug=quick); null = all.
    limit_points: Optional[int] = None
    request_timeout_s: float = 300.0  # one request's HTTP timeout; a request past it is an error
    temperature: float = 0.0  # sampling temperature (0 = greedy: the same output every level)
    # Send experiment.seed with every request (vLLM seeds a sampler per request with it).
    # false: unseeded. spec_decode turns it off with a synthetic acceptance: one seed would give
    # every request the same acceptance draws (vLLM draws them from the request's generator).
    request_seed: bool = True
    # POST /reset_prefix_cache before each level so levels don't help each other.
    reset_prefix_cache: bool = True
    # stream_options.continuous_usage_stats: exact token count of every chunk.
    continuous_usage: bool = True
    # Saturation: first level after which throughput grows by less than this fraction.
    saturation_gain: float = 0.1
    # A level is invalid when the client lagged: its figures would then measure the client,
    # not the server. How that is judged: validity.rule, relative to the level's own step
    # (the default) or the absolute limit below (k25exp.config.experiments.validity).
    validity: ValidityConfig = field(default_factory=ValidityConfig)
    # validity.rule=absolute: the p99 of the send lag (actual − scheduled send time; its max
    # under 100 sends) or the mean of the event loop's wake-up lag above this is client lag.
    # relative: the limit only where a level measured no step (no request streamed 2 chunks).
    max_client_lag_ms: float = 20.0
    # A level is also invalid when tokens made on time reached the client late, in a burst
    # (k25exp.load.stalls): a run of >= stall_min_chunks chunks each within
    # stall_burst_frac x the decode step of the last, after a silence of >= 2 steps and
    # >= stall_min_gap_ms.
    stall_burst_frac: float = 0.1
    stall_min_chunks: int = 3
    stall_min_gap_ms: float = 5.0
    progress: bool = True  # a live progress line per level on the terminal
    # Client processes sending a level's load as one (k25exp.load.shards): 0 = auto, enough
    # that each streams at most 8,000 chunks/s of the most the level can stream (C / the single
    # stream's TPOT; open loop: rate x output_tokens; without a single stream: C / 64),
    # at most half the CPUs; N = N (fewer where a level has fewer streams or requests).
    client_processes: int = 0
    # The client's event loop: auto (uvloop when importable, else asyncio), uvloop, asyncio.
    client_event_loop: str = "auto"
    fault: MacroFaultConfig = field(default_factory=MacroFaultConfig)

    # What a level is: its value (sweep_levels), its MLflow step and that step's label
    # (step_of, step_label: inverses), the requests it is sent and the most in flight.

    def sweep_levels(self) -> list:
        """The sweep's levels: concurrencies (closed loop), request rates (open loop) or a
        trace's speedups, the first limit_points of them."""
        levels = {"open": self.request_rate, "trace": self.trace.speedup}.get(self.load, self.concurrency)
        return list(levels[:self.limit_points])

    def step_axis(self) -> str:
        """A level is a concurrency (closed loop), a request rate (open loop) or a trace's
        speedup."""
        return {"open": "req/s", "trace": "speedup"}.get(self.load, "c")

    def step_of(self, level: float) -> int:
        """The MLflow step a level's figures go to: its concurrency, or its rate or speedup ×
        1000 (MLflow steps are integers); step_label reads it back."""
        return int(round(level * 1000)) if self.load in ("open", "trace") else int(level)

    def step_label(self, step: int) -> str:
        """The concurrency, or the rate or speedup (step = either × 1000); step_of's inverse."""
        return f"{step / 1000:g}" if self.load in ("open", "trace") else str(step)

    def requests_for(self, level: float) -> int:
        """Requests at a level: experiment.requests, else `rounds` rounds of the closed loop's
        workers, or `rounds` seconds of the open loop's arrivals; at least min_requests."""
        if self.requests is not None:
            return self.requests
        return level_requests(self.rounds, level, self.min_requests)

    def max_in_flight(self) -> int:
        """The most requests a phase has in flight: the closed loop's largest concurrency, or
        the open loop's (and a trace's) cap (experiment.max_concurrency, else OPEN_LOOP_CAP).
        The client's connection pool is sized above it, so no request waits inside the HTTP
        library, where the wait would land in its TTFT."""
        if self.load in ("open", "trace"):
            return self.max_concurrency or OPEN_LOOP_CAP
        return max(self.concurrency)

    def lag_reference(self) -> Optional[tuple[float, str]]:
        """The time a level's client lag is held against under validity.rule=relative, with
        its name, where it is not the level's own step (None: the step, its mean ITL)."""
        return None

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """The serving benchmark and what it needs of its server (the server group's own
        checks: k25exp.config.server_checks, for every experiment with a server)."""
        super().check(cfg, problems)
        srv = cfg.server
        positive(self, "experiment", ["input_tokens", "output_tokens", "rounds", "min_requests",
                                      "request_timeout_s", "max_client_lag_ms", "repeats"], problems)
        non_negative(self, "experiment", ["warmup", "single_stream_requests", "saturation_gain",
                                          "temperature", "stall_min_gap_ms", "client_processes"], problems)
        self.validity.problems("experiment.validity", problems)
        if self.client_event_loop not in ("auto", "asyncio", "uvloop"):
            problems.append(f"experiment.client_event_loop={self.client_event_loop!r}: expected auto, "
                            "asyncio or uvloop")
        if not 0 < self.stall_burst_frac < 1:
            problems.append(f"experiment.stall_burst_frac={self.stall_burst_frac}: expected a fraction of a "
                            "decode step, 0 < x < 1")
        if self.stall_min_chunks < 2:
            problems.append(f"experiment.stall_min_chunks={self.stall_min_chunks}: expected >= 2 (a burst "
                            "is at least two chunks closer together than a decode step)")
        if self.output_tokens == 1:
            problems.append("experiment.output_tokens=1: TPOT needs at least 2 output tokens")
        if not self.concurrency or any(x <= 0 for x in self.concurrency):
            problems.append(f"experiment.concurrency={self.concurrency}: expected a non-empty list of "
                            "positive integers")
        elif len(set(self.concurrency)) != len(self.concurrency):
            problems.append(f"experiment.concurrency={self.concurrency}: levels must be distinct (each is a step)")
        for key in ("requests", "limit_points"):
            v = getattr(self, key)
            if v is not None and v <= 0:
                problems.append(f"experiment.{key}={v}: expected a positive number or null")
        if self.load not in ("closed", "open", "trace", "sessions"):
            problems.append(f"experiment.load={self.load!r}: expected closed, open, trace or sessions")
        self.input_len.problems("experiment.input_len", "experiment.input_tokens", self.input_tokens, problems)
        self.output_len.problems("experiment.output_len", "experiment.output_tokens", self.output_tokens,
                                 problems)
        if self.load == "trace":
            self.trace.problems(problems)
            for key in ("duration_s", "prefix_tokens"):
                if getattr(self, key):
                    problems.append(f"experiment.{key}={getattr(self, key)} with experiment.load=trace: "
                                    "the trace says what is sent and what prompts share (set it to "
                                    f"{'null' if key == 'duration_s' else 0})")
        if self.load == "sessions":
            self.sessions.problems(problems)
            if self.duration_s is not None:
                problems.append(f"experiment.duration_s={self.duration_s} with experiment.load=sessions: "
                                "a level runs experiment.sessions.count sessions (set it to null)")
        if self.load == "open":
            if not self.request_rate or any(not r > 0 for r in self.request_rate):
                problems.append(f"experiment.request_rate={self.request_rate}: expected a non-empty list of "
                                "rates > 0 (requests/s)")
            elif len(set(self.request_rate)) != len(self.request_rate):
                problems.append(f"experiment.request_rate={self.request_rate}: rates must be distinct (each is a step)")
            if not self.burstiness > 0:
                problems.append(f"experiment.burstiness={self.burstiness}: expected > 0 (1 = Poisson)")
        if self.load in ("open", "trace"):  # both send on a schedule, under a cap
            if self.max_concurrency is not None and self.max_concurrency < 1:
                problems.append(f"experiment.max_concurrency={self.max_concurrency}: expected >= 1 or null")
            if not 0 < self.max_rate_error < 1:
                problems.append(f"experiment.max_rate_error={self.max_rate_error}: expected a fraction, 0 < x < 1")
        if self.prefix_tokens < 0 or self.prefix_groups < 1:
            problems.append(f"experiment.prefix_tokens={self.prefix_tokens}, prefix_groups={self.prefix_groups}: "
                            "expected prefix_tokens >= 0 and prefix_groups >= 1")
        elif self.prefix_tokens >= self.input_tokens - 1:
            problems.append(f"experiment.prefix_tokens={self.prefix_tokens}: must leave room for each prompt's "
                            f"own tokens in experiment.input_tokens={self.input_tokens}")
        if self.ramp_s < 0:
            problems.append(f"experiment.ramp_s={self.ramp_s}: expected >= 0 seconds")
        for k, v in self.slo.bounds().items():
            if v <= 0:
                problems.append(f"experiment.slo.{k}={v}: expected a latency in ms > 0 (or null: no bound)")
        if self.duration_s is not None and self.duration_s <= 0:
            problems.append(f"experiment.duration_s={self.duration_s}: expected > 0 or null")
        f = self.fault
        if f.kill_server_at_level is not None:
            if srv.kind != "vllm":
                problems.append("experiment.fault.kill_server_at_level needs server.kind='vllm' "
                                "(a server this job launched)")
            if f.kill_server_at_level not in self.concurrency:
                problems.append(f"experiment.fault.kill_server_at_level={f.kill_server_at_level}: expected "
                                f"one of experiment.concurrency={self.concurrency}")
        # vLLM's dev endpoints answer without the API key: loopback only, unless opted in
        problems += dev_endpoint_problems(cfg.server, "experiment.reset_prefix_cache=true uses "
                                          "/reset_prefix_cache" if self.reset_prefix_cache else None,
                                          ", or set experiment.reset_prefix_cache=false")

# spec_decode's names, shared by its runner, its points and `k25exp compare` (which reads a
# run folder's config.resolved.yaml, not a typed config)
def draft_order(num_speculative_tokens: int, draft_lengths: Optional[List[int]]) -> list[int]:
    """The draft lengths a spec_decode job measures, num_speculative_tokens first."""
    k = num_speculative_tokens
    return [k, *[x for x in draft_lengths or [] if x != k]]


def spec_server_name(k: int, multi: bool) -> str:
    """A speculative server's name in the job's plan and its rounds/ folders (spec, or spec_k3
    in a job of several draft lengths; points.csv says server=spec and its k)."""
    return f"spec_k{k}" if multi else "spec"


def spec_point_name(alpha: Optional[float], k: Optional[int] = None) -> str:
    """A point's metric prefix: a0.7, or model (as the drafter achieves); with a draft length
    (a job of several, experiment.draft_lengths) k3/a0.7."""
    name = "model" if alpha is None else f"a{alpha:g}"
    return name if k is None else f"k{k}/{name}"


@experiment
@dataclass
class SpecDecodeConfig(MacroConfig, SpeculativeSettings):
    """Speculative decoding measured with the macro client, against its own baseline.

    The server runs with vLLM's --speculative-config built from these fields; the baseline
    is the same server without it (same settings otherwise), measured in the same job.
    """

    recover: ClassVar[Optional[str]] = None
    no_recovery: ClassVar[str] = ("spec_decode: its speedup needs both servers' phases, and the "
                                  "baseline runs after the speculative one; its requests are kept")
    samples: ClassVar[Optional[str]] = "k25exp.compare.samples.spec_decode_folder"
    sample_artifacts: ClassVar[tuple[str, ...]] = ("spec/requests.jsonl", "baseline/requests.jsonl",
                                                   "baseline_sync/requests.jsonl", "rounds",
                                                   "config.resolved.yaml")

    campaign_order: ClassVar[Optional[int]] = 7
    headline: ClassVar[tuple[str, ...]] = ("spec_speedup", "level_spec_speedup", "acceptance_rate")
    step_headline: ClassVar[tuple[str, ...]] = ("level_spec_speedup", "tpot_ms_p50")
    # n-gram lookup and the model as its own draft (the upper bound) in one process, so both
    # measure against one baseline server
    campaign_sweep: ClassVar[str] = "spec=ngram,self_draft"

    name: str = "spec_decode"
    _target_: str = "k25exp.runners.spec_decode.run"
    concurrency: List[int] = field(default_factory=lambda: [1, 2, 4])
    # (the speculative settings and the acceptance: SpeculativeSettings' fields)
    baseline: bool = True  # also measure the server without speculative decoding
    # The baseline once more with --no-async-scheduling: the scheduling a drafter that turns
    # async scheduling off (vLLM's ngram, suffix, medusa ...) runs, so the report can split
    # the speedup's gap into scheduling and the rest.
    baseline_sync: bool = True
    # Each point measured this many times, every server started afresh each time and the
    # servers alternated (spec, baseline, baseline_sync, then the reverse order), so the
    # spread holds what a rerun moves: start-to-start differences and drift.
    spec_repeats: int = 1
    # Draft lengths measured in one job, one speculative server each, interleaved in every
    # round beside one baseline start (S3 S1 S5 B | B S5 S1 S3 | ...): points of different k
    # then share what the machine did in that round. Separate jobs per k (a multirun over
    # num_speculative_tokens) run minutes apart, and on a 2-core CPU the baseline moved 18 %
    # between them, more than the step model's 10 % goal. Must hold num_speculative_tokens,
    # which goes first (round 1's figures under the macro's names are its server's); empty:
    # num_speculative_tokens alone.
    draft_lengths: List[int] = field(default_factory=list)
    # A baseline start before and after every speculative server in each round (B S3 B S1 B S5
    # B): each speedup pairs the speculative server with the mean of the two baselines measured
    # next to it. On a 2-core CPU the baseline moved 25 % between rounds of one job, and a
    # round's last server ran up to 10 minutes after its first. Costs one baseline start per
    # speculative server and round.
    baseline_beside: bool = False

    def k_values(self) -> list[int]:
        """The draft lengths this job measures, num_speculative_tokens first."""
        return draft_order(self.num_speculative_tokens, self.draft_lengths)

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """The speculative setting and the servers it launches."""
        super().check(cfg, problems)
        self.speculative_problems(cfg, "spec_decode", problems)
        if self.draft_lengths:
            ks = list(self.draft_lengths)
            if any(k < 1 for k in ks) or len(set(ks)) != len(ks):
                problems.append(f"experiment.draft_lengths={ks}: expected distinct draft lengths "
                                ">= 1 (e.g. [1,3,5]), or [] for experiment.num_speculative_tokens alone")
            elif self.num_speculative_tokens not in ks:
                problems.append(f"experiment.draft_lengths={ks} lacks experiment."
                                f"num_speculative_tokens={self.num_speculative_tokens}, the draft "
                                "length whose server round 1's headline figures come from: add it, "
                                f"or set experiment.num_speculative_tokens={ks[0]}")
        if self.acceptance == "synthetic" and len(self.alphas) > 1:
            # α changes between levels, inside the server's workers
            self.acceptance_rpc_problems(
                cfg, "experiment.acceptance=synthetic sets each α through /collective_rpc",
                ", or sweep α one job each (-m 'experiment.alphas=[0.5],[0.9]')", problems)
        if self.baseline_beside and not self.baseline:
            problems.append("experiment.baseline_beside=true needs experiment.baseline=true (the "
                            "baselines it places beside each speculative server)")
        if self.spec_repeats < 1:
            problems.append(f"experiment.spec_repeats={self.spec_repeats}: expected >= 1")
        if self.load in ("trace", "sessions"):  # its comparison is per concurrency or rate
            problems.append(f"experiment.load={self.load}: spec_decode measures a closed or an open "
                            "loop (use experiment=macro for a trace or sessions, on each server "
                            "setting)")


@experiment
@dataclass
class SloSearchConfig(MacroConfig):
    """The highest load whose latencies meet an SLO: probes of one level each (the macro
    measurement: an open loop, a closed loop, a trace's speedup or multi-turn sessions in
    flight) on one server start, bracketing then bisection.

    A probe meets the SLO when the `percentile` of each metric in `slo` (TTFT and E2E from
    the scheduled send) is at or below its bound, and the level is valid. Each probe is a
    child run; the answer is max_rate_meeting_slo (max_concurrency_meeting_slo,
    max_speedup_meeting_slo). With load=sessions, search_over=concurrency searches the
    sessions in flight (how many conversations the server holds within the SLO): each turn
    is one of the probe's requests, its TTFT from its own scheduled send (the answer before
    it plus the think time), the percentile over every turn of the probe together.
    """

    example_overrides: ClassVar[tuple[str, ...]] = ("experiment.slo.ttft_ms=500",)
    recover: ClassVar[Optional[str]] = None
    no_recovery: ClassVar[str] = ("slo_search: its answer is the bracket the search closes, which "
                                  "a killed search never closed; its probes' requests are kept")
    samples: ClassVar[Optional[str]] = None
    no_samples: ClassVar[str] = ("no samples (each probe is a load of its own; the answer is "
                                 "compared as a figure)")

    headline: ClassVar[tuple[str, ...]] = ("max_rate_meeting_slo", "max_concurrency_meeting_slo")
    campaign_order: ClassVar[Optional[int]] = None  # not a campaign phase (macro's is inherited)

    name: str = "slo_search"
    _target_: str = "k25exp.runners.slo_search.run"
    # rate (open loop) | concurrency (closed loop, or sessions in flight with load=sessions) |
    # speedup (load=trace)
    search_over: str = "rate"
    load: str = "open"  # follows search_over (validated)
    percentile: int = 90  # 50 | 90 | 99 of each SLO metric
    start: float = 1.0  # first probe (req/s or concurrency)
    # Bracketing doubles (or halves) from `start` within [lowest, highest].
    lowest: float = 0.125
    highest: float = 256.0
    # Bisection stops when (fail - pass) / pass <= tolerance (rate), or fail - pass <= 1
    # (concurrency).
    tolerance: float = 0.1
    max_probes: int = 12  # the search stops after this many probes
    min_requests: int = 20  # per probe: enough for the percentile (p90 needs 10)
    single_stream_requests: int = 0
    # every probe at exactly its rate: 20 Poisson arrivals are otherwise ±22 % off it, and a
    # probe at 2 req/s that happened to send at 4 met an SLO one at 3 (sent at 3.7) missed
    exact_rate: bool = True

    def lag_reference(self) -> Optional[tuple[float, str]]:
        """A probe's client lag is held against the SLO's tightest bound, not the step: a
        send late by a fraction of it could move the probe's verdict (TTFT and E2E count from
        the scheduled send), one late by a fraction of a step could not."""
        bounds = self.slo.bounds()
        if not bounds:
            return None
        key = min(bounds, key=bounds.get)
        return bounds[key], f"the SLO's p{self.percentile} {key} bound"

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """The bounds and the search's range."""
        super().check(cfg, problems)
        from k25exp.stats import min_samples

        loads = {"rate": ("open",), "concurrency": ("closed", "sessions"), "speedup": ("trace",)}
        if self.search_over not in loads:
            problems.append(f"experiment.search_over={self.search_over!r}: expected rate, concurrency or speedup")
        elif self.load not in loads[self.search_over]:
            problems.append(f"experiment.load={self.load!r} with search_over={self.search_over}: a rate search "
                            "runs the open loop (load=open), a concurrency search the closed loop or "
                            "multi-turn sessions (load=closed or sessions: workers or sessions in "
                            "flight), a speedup search a trace (load=trace)")
        if not self.slo.bounds():
            problems.append("experiment.slo: no bound set; expected at least one of "
                            + str(sorted(f.name for f in fields(SloConfig)))
                            + ", e.g. experiment.slo.ttft_ms=500")
        if self.percentile not in (50, 90, 99):
            problems.append(f"experiment.percentile={self.percentile}: expected 50, 90 or 99")
        else:
            need = min_samples(self.percentile)
            n = self.requests if self.requests is not None else self.min_requests
            if self.load == "sessions" and self.sessions.count is not None:
                # every turn is a request the percentile is over; count sessions a probe
                n = self.sessions.count * self.sessions.turns
                if n < need:
                    problems.append(f"experiment.sessions.count={self.sessions.count} x turns="
                                    f"{self.sessions.turns} = {n} turns a probe: p{self.percentile} "
                                    f"needs at least {need} (raise count, or set it to null)")
            elif n < need and self.load != "trace":  # a trace's probes send its lines
                problems.append(f"experiment.min_requests / requests = {n}: p{self.percentile} needs at least "
                                f"{need} requests per probe")
        if not 0 < self.lowest <= self.start <= self.highest:
            problems.append(f"experiment.lowest={self.lowest}, start={self.start}, highest={self.highest}: "
                            "expected 0 < lowest <= start <= highest")
        if not self.tolerance > 0:
            problems.append(f"experiment.tolerance={self.tolerance}: expected > 0")
        if self.max_probes < 2:
            problems.append(f"experiment.max_probes={self.max_probes}: expected >= 2")
