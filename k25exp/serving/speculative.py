"""vLLM's --speculative-config from an experiment config, and the self-draft checkpoint.

The self-draft (the served checkpoint as its own draft model) bounds acceptance from above:
at temperature 0 the draft proposes exactly the target's greedy tokens, so every rejection
is numerical (bf16 ties in a random-weight model, batched vs single-token kernels). vLLM
reads a DeepseekV3 checkpoint given as a *draft* as a multi-token-prediction head
(SpeculativeConfig.hf_config_override turns model_type deepseek_v3 into deepseek_mtp), which
a checkpoint without MTP layers cannot be. The self-draft folder is therefore the same
weights (symlinks) under a config.json that says deepseek_v2, the same architecture family
(vLLM's DeepseekV3 model subclasses its V2 one), which vLLM loads as a plain causal LM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from k25exp.config.experiments.speculative import SpeculativeSettings
from k25exp.config.spec_methods import EAGLE3_HEAD
from k25exp.serving.draft_head import eagle3_head
from k25exp.serving.spec_acceptance import speculative_keys

# Methods that need no draft model: the draft_model field is ignored for them.
MODEL_FREE = ("ngram", "ngram_gpu", "suffix")
# model_type vLLM rewrites to an MTP head when given as a draft → what the self-draft says.
MTP_REWRITTEN = {"deepseek_v3": ("deepseek_v2", "DeepseekV2ForCausalLM")}


def self_draft_checkpoint(model_path: Path, cache_dir: Path) -> Path:
    """A folder serving `model_path`'s weights as a standalone draft model (see above)."""
    model_path = Path(model_path).resolve()
    cfg = json.loads((model_path / "config.json").read_text())
    rewrite = MTP_REWRITTEN.get(cfg.get("model_type", ""))
    if rewrite is None:
        return model_path  # vLLM loads it as a draft as it is
    out = Path(cache_dir) / f"{model_path.name}-selfdraft"
    out.mkdir(parents=True, exist_ok=True)
    for f in model_path.iterdir():
        if f.name == "config.json":
            continue
        link = out / f.name
        if link.is_symlink() and link.resolve() == f.resolve():
            continue
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(f)
    cfg["model_type"], cfg["architectures"] = rewrite[0], [rewrite[1]]
    cfg["k25exp_self_draft_of"] = str(model_path)
    text = json.dumps(cfg, indent=2, sort_keys=True)
    target = out / "config.json"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return out


def speculative_config(exp: SpeculativeSettings, model_path: Path, cache_dir: Path) -> dict[str, Any]:
    """The --speculative-config JSON object for this experiment."""
    spec: dict[str, Any] = {"method": exp.method, "num_speculative_tokens": exp.num_speculative_tokens}
    if exp.method in ("ngram", "ngram_gpu"):
        spec.update(prompt_lookup_min=exp.prompt_lookup_min, prompt_lookup_max=exp.prompt_lookup_max)
    elif exp.method == "draft_model" and exp.draft_model == "self":
        spec["model"] = str(self_draft_checkpoint(model_path, cache_dir))
    elif exp.draft_model == EAGLE3_HEAD:  # the config check holds it to method=eagle3
        spec["model"] = str(eagle3_head(model_path, cache_dir))
    elif exp.method not in MODEL_FREE and exp.draft_model and exp.draft_model != "self":
        # a draft checkpoint, an EAGLE head ...; "self" means nothing to eagle/mtp (mtp reads
        # the target's own MTP layers), so it is left to vLLM's default there
        spec["model"] = str(Path(exp.draft_model).resolve())
    spec.update(dict(exp.extra))
    if exp.acceptance == "synthetic":  # started at the first α; the others set in place
        spec.update(speculative_keys(exp.alphas[0], exp.num_speculative_tokens))
    return spec


def describe(exp: SpeculativeSettings) -> str:
    """What this configuration bounds, for the run's tags and the report."""
    what = _drafter(exp)
    if exp.acceptance == "synthetic":
        return (f"{what}; acceptance configured: vLLM's synthetic rejection sampling accepts "
                f"each draft position with probability α (α in {list(exp.alphas)}), whatever "
                "the weights say, so the figures time the drafter and the verification, not "
                "a model's acceptance")
    return what


def _drafter(exp: SpeculativeSettings) -> str:
    if exp.method in ("ngram", "ngram_gpu"):
        return ("n-gram prompt lookup, no draft model: drafts only where the last tokens repeat "
                "earlier ones; k25exp's prompts are random tokens, so what it accepts comes from "
                "repeats in the output (a random-weight model's greedy output loops)")
    if exp.draft_model == "self" and exp.method == "draft_model":
        return ("the served checkpoint as its own draft: at temperature 0 only numerics (ties "
                "broken differently by batched and single-token kernels) reject a draft, the "
                "upper bound on acceptance, at the cost of one full-model pass per draft token")
    if exp.draft_model == EAGLE3_HEAD:
        return ("an EAGLE-3 head (one MLA decoder layer reading three target layers) built from the "
                "served checkpoint's config, with random or dummy weights: it costs what a "
                "trained head costs per draft, and accepts nothing a trained head would")
    return f"{exp.method} with draft {exp.draft_model or '(vLLM default)'}"
