"""The tracking group's rule: a run's heartbeat against the time after which a run on another
host is judged dead (k25exp.tracking.liveness, recover). Checked with the rest of the config
(k25exp.config.validate) and again where a multirun opens its parent run, before any job's
config is validated (k25exp.tracking.runs.open_run)."""

from __future__ import annotations


def tracking_problems(tracking) -> list[str]:
    """The problems of a tracking config (TrackingConfig, or its DictConfig), each naming its
    keys."""
    if tracking.heartbeat_s and tracking.stale_after_s < 2 * tracking.heartbeat_s:
        return [f"tracking.stale_after_s={tracking.stale_after_s:g} must be at least twice "
                f"tracking.heartbeat_s={tracking.heartbeat_s:g}: a run on another host that "
                "beats on time would be judged dead and ended"]
    return []
