"""Which experts a MoE layer's tokens go to: a setting, carried to the server, the MoE
micro-benchmark and the floor alike (model.routing).

    learned  the checkpoint's router decides (a trained model's own routing)
    uniform  each token takes top_k distinct experts uniformly at random: vLLM's routing
             simulator `uniform_random` (top-k of uniform scores, weights 1)
    skewed   hot experts: vLLM's `normal_routing`, each of a token's top_k ids drawn on its
             own as floor(sigmoid(z) · E) with z ~ N(0, 1) (the middle experts get most
             tokens; a token may draw one expert twice), weights |N(0, 1)| normalised

Why a setting: with dummy or random weights (`--load-format dummy`) the router is no
trained router: on the H200 it sent a batch of 32 to a few experts and the Kimi rank's MoE
ran at 0.26× its uniform-routing micro-benchmark. vLLM ≥ 0.26 replaces the router's choice
when VLLM_MOE_ROUTING_SIMULATION_STRATEGY is set (its router_factory), so a dummy-weight
server defaults to `uniform`. `learned` on dummy weights measures that collapsed routing and
says so (warning()).

Pure Python (no torch): the micro-benchmark's sampler is k25exp.gemm.moe.route.
"""

from __future__ import annotations

import math
from typing import Any, Optional

ROUTINGS = ("learned", "uniform", "skewed")
# vLLM's routing simulator strategy for each (learned: none, the router decides)
VLLM_STRATEGY = {"learned": None, "uniform": "uniform_random", "skewed": "normal_routing"}
ENV = "VLLM_MOE_ROUTING_SIMULATION_STRATEGY"

DESCRIBE = {
    "learned": "the router's own choice (model.routing=learned)",
    "uniform": "top-k distinct experts uniformly at random per token (vLLM uniform_random)",
    "skewed": "hot experts: each id floor(sigmoid(z)·E), z ~ N(0, 1) (vLLM normal_routing)",
}


def check(routing: Optional[str]) -> Optional[str]:
    """Why model.routing is not a valid value (None if it is)."""
    if routing is None or routing in ROUTINGS:
        return None
    return f"model.routing={routing!r}: expected one of {', '.join(ROUTINGS)} or null (auto)"


def effective(model: Any, load_format: Optional[str]) -> str:
    """The routing a run uses: model.routing, or when null `uniform` for a MoE model served
    with dummy weights (its router is untrained) and `learned` otherwise."""
    if model.routing is not None:
        return model.routing
    moe = getattr(model, "n_routed_experts", 0) > 0
    return "uniform" if moe and load_format == "dummy" else "learned"


def of_config(cfg: Any) -> str:
    """effective() for a whole typed config (the server group's load_format where it has one)."""
    server = getattr(cfg, "server", None)
    return effective(cfg.model, getattr(server, "load_format", None))


def server_env(routing: str) -> dict[str, str]:
    """What a vLLM server needs to route this way (nothing for `learned`)."""
    strategy = VLLM_STRATEGY[routing]
    return {ENV: strategy} if strategy else {}


def warning(routing: str, load_format: Optional[str], n_experts: int) -> Optional[str]:
    """What a `learned` routing on dummy weights measures (None when nothing to say)."""
    if routing == "learned" and load_format == "dummy" and n_experts > 0:
        return ("model.routing=learned on dummy weights (server.load_format=dummy): the router "
                "is untrained and sends a batch to a few experts, so MoE time above batch 1 is "
                "optimistic; model.routing=uniform (the default there) spreads tokens as a "
                "trained model roughly does")
    return None


def skewed_probabilities(n_experts: int) -> list[float]:
    """P(id = e) under `skewed`: floor(sigmoid(z) · E) = e  ⇔  z in [logit(e/E), logit((e+1)/E)),
    so p_e = Φ(logit((e+1)/E)) − Φ(logit(e/E)) (logit(0) = −∞, logit(1) = +∞)."""
    def phi_logit(u: float) -> float:
        if u <= 0:
            return 0.0
        if u >= 1:
            return 1.0
        z = math.log(u / (1 - u))
        return 0.5 * (1 + math.erf(z / math.sqrt(2)))

    return [phi_logit((e + 1) / n_experts) - phi_logit(e / n_experts) for e in range(n_experts)]


def distinct_experts(tokens: float, top_k: int, n_experts: int, routing: str) -> float:
    """Expected distinct experts one MoE layer runs for `tokens` tokens.

    uniform (and learned, for want of the router's statistics): each token's top_k are a
    uniform draw without replacement, so an expert is missed by a token with probability
    1 − k/E: E · (1 − (1 − k/E)^tokens). skewed: tokens·k independent draws from
    skewed_probabilities: Σ_e 1 − (1 − p_e)^(tokens·k)."""
    if tokens < 0 or not 1 <= top_k <= n_experts:
        raise ValueError(f"need tokens >= 0 and 1 <= top_k <= n_experts; got tokens={tokens}, "
                         f"top_k={top_k}, n_experts={n_experts}")
    if routing == "skewed":
        draws = tokens * top_k
        return sum(1.0 - (1.0 - p) ** draws for p in skewed_probabilities(n_experts))
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)
