"""One runner per experiment kind: a plain function `run(cfg, out_dir, recorder) -> summary`.

Runners know nothing of Hydra or MLflow: they take the typed config, write raw files,
tables and plots into `out_dir` as they go, and log figures through a Recorder. A runner
that fails raises after logging what it had measured. The experiment's schema names its
runner (`experiment._target_`); it is imported on demand, so a collective job does not pay
for the serving stack's imports (transformers, httpx) and vice versa.
"""

from __future__ import annotations

from typing import Callable

from hydra.utils import get_method


def runner_for(experiment: object) -> Callable:
    target = getattr(experiment, "_target_", None)
    if not target:
        raise KeyError(f"experiment {getattr(experiment, 'name', None)!r} "
                       f"({type(experiment).__name__}) names no runner (_target_)")
    try:
        return get_method(target)
    except Exception as e:  # hydra wraps import errors; name the key the user can fix
        raise KeyError(f"experiment._target_={target!r}: cannot import the runner ({e})") from None
