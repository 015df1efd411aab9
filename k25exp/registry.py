"""Builds objects from `_target_` entries in config, like hydra.utils.instantiate.

Kept here (a dozen lines) so the measurement cores that use it need only the standard
library and torch on a GPU node without Hydra.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping


def instantiate(spec: Mapping[str, Any], what: str = "entry") -> Any:
    if "_target_" not in spec:
        raise ValueError(f"{what}: expected a `_target_: module.function` key, got {sorted(spec)}")
    module, _, attr = str(spec["_target_"]).rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{what}: cannot import _target_ {spec['_target_']!r}: {e}") from None
    return fn(**{k: v for k, v in spec.items() if k != "_target_"})
