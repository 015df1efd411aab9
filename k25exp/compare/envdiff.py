"""What differs between the two sides' environments (tags) and configs (params).

Each side's value of a tag is the one its runs share, or "mixed: …" when they disagree. Tags
that name the run rather than its environment (ids, output folders, the campaign, MLflow's own
bookkeeping, times) are left out: they always differ.
"""

from __future__ import annotations

from typing import Iterable

from k25exp.compare.resolve import RUN_SPECIFIC_PARAMS, Side
from k25exp.tracking import ui_view
from k25exp.tracking.read import RunView

RUN_SPECIFIC_TAG_PREFIXES = ("mlflow.", "compare.", "report.")
RUN_SPECIFIC_TAGS = frozenset({
    "k25exp.output_dir", "k25exp.role", "campaign", "run_id", "parent_run_id", "start_time",
    "end_time",
    # the command line: the config params it set are diffed one by one (param_diff)
    "hydra.overrides",
    # the job's own process and liveness (k25exp.tracking.liveness), the trace files it kept
    "k25exp.pid", "k25exp.pid_start", "k25exp.heartbeat", "traces",
})
# Matched on the tag's last "/" part, so a sub-run's (spec_decode's baseline/...) too:
# the server this run talked to: its process, log file, port (server.port=0 picks one per
# start), whether this job reused it, the hash of its launch settings (from the config) ...
RUN_SPECIFIC_SUFFIXES = ("server.pid", "server.log", "server.base_url", "server.reused", "server.launch_key")
# ... and what a run found, kept as tags for people (a knee, where throughput saturated; a
# sweep's figures on its row, "tpot_ms_p50 per c": k25exp.tracking.ui_view): results,
# compared as figures where they are figures, never environment
RESULT_TAGS = frozenset({"knee", "saturation"})


def _last(tag: str) -> str:
    return tag.rsplit("/", 1)[-1]


def _side_values(runs: Iterable[RunView], get) -> dict[str, str]:
    vals: dict[str, set[str]] = {}
    for r in runs:
        for k, v in get(r).items():
            vals.setdefault(k, set()).add(str(v))
    return {k: next(iter(v)) if len(v) == 1 else "mixed: " + " | ".join(sorted(v))[:300]
            for k, v in vals.items()}


def _diff(a: dict[str, str], b: dict[str, str]) -> list[tuple[str, str, str]]:
    return [(k, a.get(k, "(absent)"), b.get(k, "(absent)")) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def tag_diff(a: Side, b: Side, pairs=None) -> list[tuple[str, str, str]]:
    """(tag, A's value, B's value) for every environment tag that differs, over the runs that
    were paired (a campaign against one phase's run: only that phase's runs on A's side, not
    tags of experiments B never ran); over the whole sides when nothing paired."""
    def env(r: RunView) -> dict[str, str]:
        return {k: v for k, v in r.tags.items()
                if k not in RUN_SPECIFIC_TAGS and not k.startswith(RUN_SPECIFIC_TAG_PREFIXES)
                and not _last(k).endswith(RUN_SPECIFIC_SUFFIXES) and _last(k) not in RESULT_TAGS
                and not ui_view.is_summary_tag(k)}
    ra = [p.a for p in pairs] if pairs else a.runs
    rb = [p.b for p in pairs] if pairs else b.runs
    return _diff(_side_values(ra, env), _side_values(rb, env))


def param_diff(pairs) -> list[tuple[str, str, str]]:
    """(param, A, B) for config values that differ within a pair (so never a swept one: pairs
    share those), each distinct difference once over all pairs."""
    seen: dict[tuple[str, str, str], None] = {}
    for p in pairs:
        a = {k: v for k, v in p.a.params.items() if not k.startswith(RUN_SPECIFIC_PARAMS)}
        b = {k: v for k, v in p.b.params.items() if not k.startswith(RUN_SPECIFIC_PARAMS)}
        for d in _diff(a, b):
            seen.setdefault(d, None)
    return sorted(seen)
