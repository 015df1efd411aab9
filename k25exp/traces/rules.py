"""Ordered regex rules that put every kernel / operator name into a category.

The rules live in YAML (conf/trace_rules/default.yaml) so a user can add a kernel name
without touching code. Format:

    categories: [attention, moe, ..., other, comm_allreduce, ...]   # display order and
                                                                     # overlap priority
    groups: {communication: [comm_allreduce, ...], gemm: [gemm_quantized, gemm_dense]}
    rules:                     # first match wins
      - category: comm_allreduce
        pattern: 'AllReduce|cross_device_reduce_|shm_allreduce'   # re.search on the name
        cat: 'kernel|cpu_op'   # optional: re.fullmatch on the trace event's category
        note: free text        # optional

A name no rule matches is `other`. `idle` is reserved (time without work in a step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESERVED = ("idle",)
FALLBACK = "other"
_RULE_KEYS = {"category", "pattern", "cat", "note"}
_NAME_OK = re.compile(r"^[a-z][a-z0-9_]*$")


class RulesError(ValueError):
    """The rules file is malformed; the message names the file and the offending rule."""


def default_rules_path() -> Path:
    """conf/trace_rules/default.yaml, through the package's config tree k25exp/conf (a link
    to the checkout's conf/; real files in an installed wheel)."""
    return Path(__file__).resolve().parents[1] / "conf" / "trace_rules" / "default.yaml"


@dataclass(frozen=True)
class Rule:
    index: int
    category: str
    pattern: re.Pattern
    cat: re.Pattern | None = None
    note: str = ""

    def matches(self, name: str, cat: str) -> bool:
        if self.cat is not None and not self.cat.fullmatch(cat):
            return False
        return self.pattern.search(name) is not None


@dataclass
class Rules:
    categories: list[str]                 # order = display order = overlap priority
    groups: dict[str, list[str]]
    rules: list[Rule]
    source: str = "<memory>"
    _cache: dict[tuple[str, str], str] = field(default_factory=dict, repr=False)

    def classify(self, name: str, cat: str = "") -> str:
        key = (name, cat)
        got = self._cache.get(key)
        if got is None:
            got = FALLBACK
            for r in self.rules:
                if r.matches(name, cat):
                    got = r.category
                    break
            self._cache[key] = got
        return got

    def rule_for(self, name: str, cat: str = "") -> Rule | None:
        for r in self.rules:
            if r.matches(name, cat):
                return r
        return None

    def group_of(self, category: str) -> str | None:
        for g, members in self.groups.items():
            if category in members:
                return g
        return None


def _fail(source: str, where: str, msg: str) -> RulesError:
    return RulesError(f"{source}: {where}: {msg}")


def _compile(source: str, where: str, what: str, rx: Any) -> re.Pattern:
    if not isinstance(rx, str) or not rx:
        raise _fail(source, where, f"{what} must be a non-empty string (a regex), got {rx!r}")
    try:
        return re.compile(rx)
    except re.error as e:
        raise _fail(source, where, f"bad {what} regex {rx!r}: {e}") from e


def rules_from_dict(doc: Any, source: str = "<memory>") -> Rules:
    """Validates a parsed rules document (see the module docstring) and compiles it."""
    if not isinstance(doc, dict):
        raise _fail(source, "top level", "expected a mapping with categories, groups, rules")
    unknown = set(doc) - {"categories", "groups", "rules", "version"}
    if unknown:
        raise _fail(source, "top level", f"unknown keys {sorted(unknown)}")
    cats = doc.get("categories")
    if not isinstance(cats, list) or not cats:
        raise _fail(source, "categories", "must be a non-empty list of names")
    for c in cats:
        if not isinstance(c, str) or not _NAME_OK.match(c):
            raise _fail(source, "categories", f"bad category name {c!r} (lower_snake_case)")
        if c in RESERVED:
            raise _fail(source, "categories", f"{c!r} is reserved (time without work)")
    if len(set(cats)) != len(cats):
        raise _fail(source, "categories", "duplicate names")
    if FALLBACK not in cats:
        raise _fail(source, "categories", f"must include {FALLBACK!r} (unmatched names)")
    groups = doc.get("groups") or {}
    if not isinstance(groups, dict):
        raise _fail(source, "groups", "must be a mapping group -> [categories]")
    for g, members in groups.items():
        if not isinstance(g, str) or not _NAME_OK.match(g) or g in cats or g in RESERVED:
            raise _fail(source, f"group {g!r}", "bad name (lower_snake_case, not a category)")
        if not isinstance(members, list) or not members:
            raise _fail(source, f"group {g!r}", "must list its categories")
        for m in members:
            if m not in cats:
                raise _fail(source, f"group {g!r}", f"unknown category {m!r}")
    raw = doc.get("rules")
    if not isinstance(raw, list):
        raise _fail(source, "rules", "must be a list")
    rules = []
    for i, r in enumerate(raw, start=1):
        if not isinstance(r, dict):
            raise _fail(source, f"rule #{i}", f"expected a mapping, got {r!r}")
        where = f"rule #{i} ({r.get('category', '?')}: {r.get('pattern', '?')!r})"
        extra = set(r) - _RULE_KEYS
        if extra:
            raise _fail(source, where, f"unknown keys {sorted(extra)}")
        cat = r.get("category")
        if cat not in cats:
            raise _fail(source, where, f"unknown category {cat!r} (declare it in categories)")
        pattern = _compile(source, where, "pattern", r.get("pattern"))
        ev_cat = _compile(source, where, "cat", r["cat"]) if r.get("cat") is not None else None
        rules.append(Rule(i, cat, pattern, ev_cat, str(r.get("note", ""))))
    return Rules(list(cats), {g: list(m) for g, m in groups.items()}, rules, source)


def load_rules(path: Path | str | None = None) -> Rules:
    """Loads and validates a rules file (default: conf/trace_rules/default.yaml)."""
    p = Path(path) if path is not None else default_rules_path()
    try:
        import yaml
    except ImportError as e:  # pragma: no cover - PyYAML comes with vLLM, omegaconf, ...
        raise RulesError(f"{p}: PyYAML is needed to read trace rules") from e
    try:
        text = p.read_text()
    except OSError as e:
        raise RulesError(f"{p}: cannot read rules file: {e.strerror or e}") from e
    try:  # libyaml's parser when PyYAML has it: a tenth of the pure-Python one's time
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise RulesError(f"{p}: not valid YAML: {e}") from e
    return rules_from_dict(doc, str(p))
