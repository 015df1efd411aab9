"""The campaign's phases, in order, as the experiment schemas declare them.

multirun.sh asks this module (`python -m k25exp.config.campaign`) for its phase list, each
phase's sweep and the config keys (dotted) each phase has, and the report for the phases it expects;
neither keeps its own list.
"""

from __future__ import annotations

from k25exp.config.experiments import EXPERIMENT_SCHEMAS


def phases(measuring_only: bool = False) -> list[str]:
    """Campaign phases in campaign order; measuring_only leaves out the report."""
    named = [(cls.campaign_order, name) for name, cls in EXPERIMENT_SCHEMAS.items()
             if cls.campaign_order is not None and (cls.measures or not measuring_only)]
    return [name for _, name in sorted(named)]


def sweep(phase: str) -> str:
    return EXPERIMENT_SCHEMAS[phase].campaign_sweep


if __name__ == "__main__":
    # One line per phase (for multirun.sh): NAME<TAB>KEYS<TAB>SWEEP ARGUMENTS, the keys being
    # every dotted key its config has (k25exp.config.scope.phase_paths: `server`, `server.port`,
    # `experiment.input_tokens` ...), so each phase gets only its own overrides (the sweep
    # last: it may be empty, and bash's read folds adjacent tabs)
    from k25exp.config.scope import phase_paths

    for p in phases():
        print(f"{p}\t{' '.join(sorted(phase_paths(p)))}\t{sweep(p)}")
