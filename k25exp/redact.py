"""Secrets never leave the process: env values whose names look secret are replaced by a
marker wherever k25exp writes them (MLflow params, config.resolved.yaml, server log headers).

A name is secret when it contains TOKEN, KEY, SECRET or PASSWORD (any case), or is listed in
`tracking.redact`. Only values under an `env` mapping are checked by name; any other string
equal to a redacted value is replaced too, so a secret interpolated elsewhere does not leak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

MARK = "***redacted***"
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)


def is_secret(name: str, extra: Iterable[str] = ()) -> bool:
    return bool(_SECRET.search(name)) or name in set(extra)


def redact_env(env: Mapping[str, Any], extra: Iterable[str] = ()) -> dict[str, Any]:
    """A copy of one environment mapping with secret-named values masked."""
    extra = set(extra)
    return {k: (MARK if is_secret(k, extra) and v not in (None, "") else v) for k, v in env.items()}


def secret_values(cfg: Mapping[str, Any], extra: Iterable[str] = ()) -> set[str]:
    """Every value under an `env` mapping anywhere in a resolved config whose name is secret."""
    extra = set(extra)
    found: set[str] = set()

    def walk(node: Any, under_env: bool) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if under_env and is_secret(str(k), extra) and isinstance(v, (str, int)) and str(v):
                    found.add(str(v))
                walk(v, str(k) == "env")
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v, False)

    walk(cfg, False)
    return found


def scrub(node: Any, values: set[str]) -> Any:
    """`node` with any string containing one of `values` masked (recursively)."""
    if not values:
        return node
    if isinstance(node, Mapping):
        return {k: scrub(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [scrub(v, values) for v in node]
    if isinstance(node, tuple):
        return tuple(scrub(v, values) for v in node)
    if isinstance(node, str):
        for s in values:
            if s and s in node:
                node = node.replace(s, MARK)
    return node


@dataclass(frozen=True)
class Redaction:
    """What one job masks, found once in its resolved config: the secret values and the extra
    secret names (tracking.redact). Every writer of the job takes this object, so none walks
    the config for secrets again."""

    values: frozenset[str] = frozenset()
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, resolved: Mapping[str, Any], names: Iterable[str] = ()) -> "Redaction":
        names = tuple(names)
        return cls(frozenset(secret_values(resolved, names)), names)

    def __call__(self, node: Any) -> Any:
        """`node` (a string, or a resolved config of dicts and lists) with every secret masked."""
        return scrub(node, self.values)

    def overrides(self, overrides: Iterable[str]) -> list[str]:
        """Command-line overrides masked: secret-named env keys by name, any secret by value."""
        return [self(o) for o in redact_overrides(overrides, self.names)]


def redact_overrides(overrides: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """Command-line overrides with the values of secret-named env keys masked
    (`server.env.HF_TOKEN=abc` → `server.env.HF_TOKEN=***redacted***`)."""
    extra = set(extra)
    out = []
    for o in overrides:
        key, eq, value = o.partition("=")
        parts = key.lstrip("+~").split(".")
        if eq and len(parts) >= 2 and parts[-2] == "env" and is_secret(parts[-1], extra) and value:
            o = f"{key}={MARK}"
        out.append(o)
    return out
