"""Run params from a config: nested keys flattened. No MLflow import: offline runs on
nodes without MLflow (GPU boxes) log params through this too."""

from __future__ import annotations

import json
from typing import Any, Mapping


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{'model': {'hidden_size': 7168}} → {'model.hidden_size': '7168'}; lists as JSON."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(v)
        else:
            out[key] = "null" if v is None else str(v)
    return out
