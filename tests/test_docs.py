"""The docs site is generated from the code (docs/hooks/reference.py, an MkDocs hook): every
key of every schema has a description (the comment on it in the source), every registered
experiment a page, and every metric a real campaign logs an entry in docs/metrics.yaml."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from typing import ClassVar, Optional

import pytest

from k25exp.config.experiments import EXPERIMENT_SCHEMAS, ExperimentBase
from tests.conftest import ROOT


def _reference():
    spec = importlib.util.spec_from_file_location("k25exp_docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


ref = _reference()


def test_every_schema_key_has_a_docs_entry():
    """A key added to a schema without a comment fails here, naming it and its class."""
    missing = [f"experiment={name}: experiment.{k}" for name, cls in EXPERIMENT_SCHEMAS.items()
               for k in ref.undocumented(cls)]
    missing += [k for group, cls in ref.config_classes() for k in ref.undocumented(cls, f"{group}." if group else "")]
    assert not missing, ("schema keys without a docs entry (a `# comment` on the field or right above it "
                         "in its schema class):\n  " + "\n  ".join(missing))


def test_every_key_is_on_its_experiment_page():
    for name, cls in EXPERIMENT_SCHEMAS.items():
        page = ref.experiment_page(name)
        for k in ref.keys(cls):
            if k.key not in ("name", "_target_"):
                row = next((ln for ln in page.splitlines() if ln.startswith(f"| `{k.key}` |")), None)
                assert row and "**undocumented**" not in row, (name, k.key)
    config = ref.config_page()
    for group, cls in ref.config_classes():
        if group:
            assert all(f"| `{group}.{k.key}` |" in config for k in ref.keys(cls)), group


def test_a_key_without_a_comment_is_caught():
    """The check itself: a schema with an uncommented key fails, commented (on the line, above
    it, or named by the comment above its run of fields) passes."""

    @dataclass
    class Bare(ExperimentBase):
        name: str = "bare"  # the experiment's name
        size: int = 1

    @dataclass
    class Commented(ExperimentBase):
        headline: ClassVar[tuple[str, ...]] = ()
        name: str = "commented"  # the experiment's name
        size: int = 1  # bytes per op
        # Bracketing within [lowest, highest].
        lowest: float = 0.1
        highest: float = 9.0
        # How long to wait
        timeout_s: Optional[float] = None

    assert ref.undocumented(Bare) == ["size (Bare)"]
    assert ref.undocumented(Commented) == []
    assert ref.comment(Commented, "highest")[0] == "Bracketing within [lowest, highest]."
    assert ref.comment(Commented, "warmup")[1] == "ExperimentBase"  # inherited with its comment


def test_every_registered_experiment_has_a_page_and_a_metrics_section():
    pages = ref.pages()
    for name in EXPERIMENT_SCHEMAS:
        assert f"experiments/{name}.md" in pages
        assert ref.has_metric_docs(name), f"docs/metrics.yaml has no section for experiment {name}"
    sections = {s for s in ref.metric_docs() if not s.startswith("_")}
    assert sections <= set(EXPERIMENT_SCHEMAS), sections - set(EXPERIMENT_SCHEMAS)


def test_metric_patterns():
    p = ref.pattern("<shape>.tp<N>/<kernel>/{latency_us,tflops}")
    assert p.match("expert_gate_up.tp2/torch_bf16/latency_us")
    assert not p.match("expert_gate_up.tp2/torch_bf16/gbps")
    assert ref.pattern("share_<category>").match("share_comm_allreduce")


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_every_metric_a_campaign_logs_is_documented(campaign_full):
    """Every metric of every run of a real ./multirun.sh campaign (each phase, their parents,
    the report) has a docs/metrics.yaml entry under its experiment."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(campaign_full.uri)
    exps = {e.experiment_id: e.name.split("/", 1)[-1] for e in c.search_experiments()}
    runs = c.search_runs(list(exps), max_results=1000)
    seen, missing = set(), []
    for r in runs:
        exp = exps[r.info.experiment_id]
        section = "_parent" if r.data.tags.get("k25exp.role") == "parent" else exp
        for key in r.data.metrics:
            seen.add(section)
            if (section == "_parent" and not any(ref.pattern(str(e["metric"])).match(key)
                                                 for e in ref.metric_docs()["_parent"])) \
                    or (section != "_parent" and ref.documented_metric(exp, key) is None):
                missing.append(f"{section}: {key}")
    assert {"macro", "profile", "nccl_burst", "gemm", "report", "_parent"} <= seen, seen
    assert not missing, "metrics logged without a docs/metrics.yaml entry:\n  " + "\n  ".join(sorted(set(missing)))
