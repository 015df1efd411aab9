"""What every experiment schema is: one unit that names its runner, its checks, how its figures
are recovered from a dead job's folder and where its raw samples are (k25exp.config.experiments).

A schema class declares, as class variables (not config keys) and one method:
  _target_          the runner, `run(cfg, out_dir, recorder) -> summary` (a config key, so a
                    user can point an experiment at their own runner)
  check(cfg, problems)  the values it cannot take (a subclass calls super().check first)
  recover / no_recovery   a function `recover(out_dir, run) -> str` (dotted path, imported
                    when `k25exp recover` needs it, so tracking never imports runners) that
                    logs the figures the folder allows, or why there are none
  samples / sample_artifacts / no_samples   a reader `samples(folder) -> {(metric, step):
                    [values]}` (dotted path) of the artifacts it keeps, for `k25exp compare`,
                    or why there are none
  campaign_order, campaign_sweep, measures, headline, headline_params, step_headline,
  step_axes, step_axis, step_label   its place in ./multirun.sh's campaign and in the MLflow
                    runs view
Registering it (@experiment) makes it `experiment=NAME` (conf/experiment/NAME.yaml holds
only what differs from these defaults).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

from omegaconf import MISSING

if TYPE_CHECKING:
    from k25exp.config.schema import K25Config

# Experiment schemas by the name used in conf/experiment/*.yaml defaults lists; filled by
# @experiment, so a new experiment is one YAML file, one schema class and one runner module.
EXPERIMENT_SCHEMAS: dict[str, type] = {}


def experiment(cls: type) -> type:
    """Registers an experiment's schema class under its `name` default."""
    name = cls.__dataclass_fields__["name"].default
    assert name not in EXPERIMENT_SCHEMAS, f"experiment {name!r} registered twice"
    assert cls.__dataclass_fields__["_target_"].default.endswith(".run"), cls
    EXPERIMENT_SCHEMAS[name] = cls
    return cls


@dataclass
class Registered:
    """What every experiment schema declares about itself (class variables: not config keys)."""

    # The runner, `run(cfg, out_dir, recorder) -> summary` (a config key, so a user can
    # point an experiment at their own runner, and the run's params say which one ran).
    _target_: str = MISSING
    # Position in ./multirun.sh's campaign (None: not a campaign phase) and its sweep
    # arguments (Hydra multirun syntax, split on spaces).
    campaign_order: ClassVar[Optional[int]] = None
    campaign_sweep: ClassVar[str] = ""
    # False for jobs that read other runs (report) rather than measure a phase.
    measures: ClassVar[bool] = True
    # The figures and params a user looks at first: the first columns of the MLflow runs
    # view `k25exp ui` links to (k25exp.tracking.ui_view), in this order.
    headline: ClassVar[tuple[str, ...]] = ()
    headline_params: ClassVar[tuple[str, ...]] = ()
    # Figures logged at every step of a sweep inside the job (macro's levels), shown on the
    # run's row in that view, every step in one column: the tag "<figure> per <axis>"
    # ("tpot_ms_p50 per c" = "1:11.7 2:12.4 ..."). The runs table shows one value per metric,
    # the last step's; this puts the whole sweep on the row a user reads first. step_axes:
    # every axis step_axis() can name (the view has a column for each; MLflow shows those
    # the listed runs have).
    step_headline: ClassVar[tuple[str, ...]] = ()
    step_axes: ClassVar[tuple[str, ...]] = ("step",)
    # What `experiment=NAME` cannot run without (no default makes sense), as example
    # overrides: the check names them when missing, and tests compose with them.
    example_overrides: ClassVar[tuple[str, ...]] = ()
    # How `k25exp recover` recomputes its figures from a killed job's folder: a function
    # `recover(out_dir, run) -> str` (what was recomputed, in words), or why there is none.
    recover: ClassVar[Optional[str]] = None
    no_recovery: ClassVar[str] = ""
    # Where `k25exp compare` finds the samples behind its figures: the artifacts to fetch and
    # a reader `samples(folder) -> {(metric, step): [values]}`, or why there are none.
    samples: ClassVar[Optional[str]] = None
    sample_artifacts: ClassVar[tuple[str, ...]] = ()
    no_samples: ClassVar[str] = ""

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """Values the experiment cannot take, each a problem naming its key (a subclass adds
        its own after super().check)."""

    def step_axis(self) -> str:
        """What this run's steps are (one of step_axes)."""
        return self.step_axes[0]

    def step_label(self, step: int) -> str:
        """How a step reads on the run's row (macro: 8, or 0.5 for 0.5 req/s)."""
        return str(step)

    @classmethod
    def missing_hooks(cls) -> list[str]:
        """The hooks this schema lacks (a registered one must have none missing)."""
        out = []
        if not cls.__dataclass_fields__["_target_"].default.endswith(".run"):
            out.append("_target_ (module.run)")
        if not cls.recover and not cls.no_recovery:
            out.append("recover or no_recovery")
        if not (cls.samples and cls.sample_artifacts) and not cls.no_samples:
            out.append("samples + sample_artifacts, or no_samples")
        return out


@dataclass
class ExperimentBase(Registered):
    """Fields every experiment has (debug=quick sets them, whatever the experiment).

    Counts are named for what they count, one name per meaning: `warmup` untimed units
    before timing starts, `bursts` timed bursts (collectives), `ops_per_burst` ops queued in
    one burst, `calls` timed kernel calls (gemm), `requests` requests (serving).
    """

    name: str = MISSING  # the experiment's name: experiment=NAME selects conf/experiment/NAME.yaml
    warmup: int = 5  # untimed units (ops, calls, requests) before anything is timed
    # Measure only the first N sweep points (the debug group uses it); null = all.
    limit_points: Optional[int] = None

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        super().check(cfg, problems)
        non_negative(self, "experiment", ["warmup"], problems)
        if self.limit_points is not None and self.limit_points <= 0:
            problems.append(f"experiment.limit_points={self.limit_points}: expected a positive number or null")


def positive(obj: object, prefix: str, names: list[str], problems: list[str]) -> None:
    for n in names:
        v = getattr(obj, n)
        if v is None or v <= 0:
            problems.append(f"{prefix}.{n}={v}: expected a positive number")


def non_negative(obj: object, prefix: str, names: list[str], problems: list[str]) -> None:
    for n in names:
        v = getattr(obj, n)
        if v < 0:
            problems.append(f"{prefix}.{n}={v}: expected >= 0")
