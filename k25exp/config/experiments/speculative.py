"""The speculative-decoding settings two experiments share: spec_decode (the speedup, measured
with the macro client) and spec_profile (the speculative server's step, profiled). The `spec=`
config group (conf/spec/) sets these fields on either."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from k25exp.config.dev_endpoints import dev_endpoint_problems
from k25exp.config.spec_methods import DRAFT_SENTINELS, method_problems

if TYPE_CHECKING:
    from k25exp.config.schema import K25Config

# --speculative-config keys k25exp sets itself from experiment.acceptance / alphas
SYNTHETIC_KEYS = {"rejection_sample_method", "synthetic_acceptance_rates",
                  "synthetic_acceptance_length"}


@dataclass
class SpeculativeSettings:
    """vLLM's --speculative-config, as experiment fields, and the acceptance it runs at."""

    # vLLM's speculative method: ngram (prompt lookup, no draft model), ngram_gpu, draft_model,
    # suffix, eagle, eagle3, mtp ... (vLLM checks the name).
    method: str = "ngram"
    num_speculative_tokens: int = 3  # k: tokens drafted per verification step
    # Model-based methods only: a checkpoint folder (draft model, EAGLE head ...), or, with
    # method=draft_model, "self" = the served checkpoint as its own draft (the upper bound on
    # acceptance at temperature 0); with method=eagle3, "eagle3_head" = an EAGLE-3 head built
    # from the served checkpoint's config (k25exp.serving.draft_head). Ignored by ngram/suffix.
    draft_model: Optional[str] = "self"
    prompt_lookup_min: int = 1  # ngram: shortest n-gram matched
    prompt_lookup_max: int = 4  # ngram: longest n-gram matched
    # Any other --speculative-config keys, passed verbatim.
    extra: Dict[str, Any] = field(default_factory=dict)
    # Acceptance: "synthetic" = vLLM's synthetic rejection sampling at each per-token
    # acceptance α of `alphas` (p_i = α^(i+1), independent of the weights:
    # k25exp.serving.spec_acceptance); "as_model" = what the drafter achieves on the served
    # weights (random or dummy weights accept whatever their repetitions give, not what a
    # trained model would).
    acceptance: str = "synthetic"
    alphas: List[float] = field(default_factory=lambda: [0.5, 0.7, 0.9])

    def speculative_problems(self, cfg: K25Config, experiment: str, problems: list[str]) -> None:
        """The settings' own checks (`experiment`: the experiment's name, for the messages)."""
        if cfg.server.kind != "vllm":
            problems.append(f"server.kind={cfg.server.kind!r}: experiment={experiment} launches its "
                            "own speculative server and needs server.kind='vllm'")
        if not self.method:
            problems.append("experiment.method: expected a vLLM speculative method (ngram, draft_model, ...)")
        if self.num_speculative_tokens < 1:
            problems.append(f"experiment.num_speculative_tokens={self.num_speculative_tokens}: expected >= 1")
        if self.method in ("ngram", "ngram_gpu"):
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if lo < 1 or hi < lo:
                problems.append(f"experiment.prompt_lookup_min={lo}, prompt_lookup_max={hi}: expected "
                                "1 <= min <= max")
        elif self.method == "draft_model" and not self.draft_model:
            problems.append("experiment.draft_model: method=draft_model needs a checkpoint folder or 'self'")
        elif self.draft_model not in (None, *DRAFT_SENTINELS) and self.method not in ("suffix",):
            if not Path(self.draft_model).exists():
                problems.append(f"experiment.draft_model={self.draft_model}: no such folder (or 'self' for "
                                "the served checkpoint)")
        if self.acceptance not in ("synthetic", "as_model"):
            problems.append(f"experiment.acceptance={self.acceptance!r}: expected 'synthetic' (vLLM's "
                            "synthetic rejection sampling at each of experiment.alphas) or 'as_model'")
        elif self.acceptance == "synthetic":
            if not self.alphas:
                problems.append("experiment.alphas: acceptance=synthetic needs at least one per-token "
                                "acceptance α")
            bad = [a for a in self.alphas if not 0.0 <= a <= 1.0]
            if bad:
                problems.append(f"experiment.alphas={list(self.alphas)}: each α must be in [0, 1], "
                                f"not {bad}")
            if SYNTHETIC_KEYS & set(self.extra):
                problems.append("experiment.extra sets the rejection sampling: with "
                                "experiment.acceptance=synthetic k25exp sets it from experiment.alphas")
        clash = sorted({"method", "num_speculative_tokens", "model"} & set(self.extra))
        if clash:
            problems.append(f"experiment.extra sets {clash}: set them with experiment.method / "
                            "num_speculative_tokens / draft_model instead")
        if any("--speculative-config" in str(a) for a in cfg.server.extra_args):
            problems.append(f"server.extra_args has --speculative-config: experiment={experiment} "
                            "builds it from experiment.*")
        method_problems(self, cfg, problems)  # what vLLM refuses here, with its message

    def acceptance_rpc_problems(self, cfg: K25Config, why: str, instead: str, problems: list[str]) -> None:
        """α set inside the running server's workers (/collective_rpc and k25exp's worker
        extension): what that needs."""
        problems += dev_endpoint_problems(cfg.server, why, instead)
        if not cfg.server.collective_probe or cfg.server.python not in (None, sys.executable):
            problems.append(f"experiment.alphas: {why} needs k25exp's worker extension in the "
                            "server (server.collective_probe=true, vLLM run by this interpreter)"
                            f"{instead}")
