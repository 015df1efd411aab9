"""Speculative acceptance as configuration: vLLM's synthetic rejection sampling, set per level.

Dummy weights accept whatever their repetitions give (every n-gram draft of the Kimi rank was
accepted), which says nothing about a trained model. vLLM (0.26 and later) can fix the
acceptance independent of the weights: `rejection_sample_method: synthetic` with per-position
*unconditional* rates p_i (the probability that the first i+1 drafts are all accepted,
non-increasing; vllm/config/speculative.py), which its rejection sampler turns into
conditional rates c_i = p_i / p_{i-1} and draws against (v1/sample/rejection_sampler.py).

k25exp describes acceptance the way the step-cost literature does (Leviathan et al. 2023): a
per-token acceptance α, independent per position, so p_i = α^(i+1) and a verification step
emits E(α, k) = (1 − α^(k+1)) / (1 − α) tokens (k + 1 at α = 1).

The server starts once in synthetic mode; `set_in_server` then changes α between levels
through vLLM's `/collective_rpc` dev endpoint: every worker copies the new conditional rates
into its rejection sampler's tensor in place (same shape, same device), so a sweep over α
needs no restart (vLLM's CPU build has no synthetic kernel: the setter installs k25exp's port
of it there, k25exp.serving.cpu_synthetic). The server's own counters (`vllm:spec_decode_num_accepted_tokens` over
`vllm:spec_decode_num_drafts`) read the acceptance back.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

METHOD = "k25exp_set_acceptance"


def unconditional_rates(alpha: float, k: int) -> list[float]:
    """p_i = α^(i+1), i = 0 … k−1: all of the first i+1 drafts accepted, each with prob. α."""
    if not 0.0 <= alpha <= 1.0 or k < 1:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 1, got alpha={alpha}, k={k}")
    return [alpha ** (i + 1) for i in range(k)]


def conditional_rates(rates: Sequence[float]) -> list[float]:
    """c_i = p_i / p_{i−1} (p_{−1} = 1; 0 after a zero): what vLLM's sampler draws against."""
    return [p / q if q > 0.0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]])]


def expected_tokens(alpha: float, k: int) -> float:
    """E(α, k): tokens a verification step emits (accepted drafts + the target's own token)."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha}, k={k}")
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def speculative_keys(alpha: float, k: int) -> dict[str, Any]:
    """The --speculative-config keys that start a server in synthetic mode at α."""
    return {"rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": unconditional_rates(alpha, k)}


class SyntheticAcceptance:
    """Mixed into vLLM's worker (k25exp.serving.worker_extension): `self` is the worker."""

    def k25exp_set_acceptance(self, spec: str) -> dict:
        import torch

        rates = [float(x) for x in json.loads(spec)["rates"]]
        runner = getattr(self, "model_runner", None)
        sampler = getattr(runner, "rejection_sampler", None)
        held = getattr(sampler, "synthetic_conditional_rates", None)
        rank = int(getattr(self, "rank", 0))
        if held is None:
            return {"rank": rank, "ok": False,
                    "why": "the server's rejection sampler is not in synthetic mode (start it "
                           "with rejection_sample_method: synthetic)"}
        new = torch.tensor(conditional_rates(rates), dtype=held.dtype, device=held.device)
        if new.shape != held.shape:
            return {"rank": rank, "ok": False,
                    "why": f"{len(rates)} rates for a sampler of {held.numel()} positions"}
        from k25exp.serving import cpu_synthetic

        sampler_kind = cpu_synthetic.install()  # the CPU build has no synthetic kernel of its own
        held.copy_(new)  # in place: the sampler and its kernels keep the same tensor
        return {"rank": rank, "ok": True, "conditional": held.tolist(), "sampler": sampler_kind}


def set_in_server(base_url: str, rates: Sequence[float], timeout_s: float = 60.0) -> list[dict]:
    """Set the unconditional rates on every worker of a synthetic-mode server (a dev
    endpoint: loopback servers only); returns each worker's answer, rank order. Raises with
    the workers' reason when any could not."""
    from k25exp.serving import worker_rpc

    results = worker_rpc.call(base_url, METHOD, {"rates": list(rates)}, timeout_s)
    bad = [x for x in results if not isinstance(x, dict) or not x.get("ok")]
    if bad or not results:
        raise RuntimeError(f"synthetic acceptance not set: {str(bad or results)[:400]} (is the "
                           "server launched with k25exp's --worker-extension-cls?)")
    return sorted(results, key=lambda x: x["rank"])
