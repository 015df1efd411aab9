"""Whether the two runs of a pair sent the same requests: the request shape, said up front.

Two serving runs whose requests differ (a length distribution against fixed lengths, another
trace, sessions against a closed loop, longer turns) differ in latency and throughput by the
workload as well as by the server, and a figure-by-figure compare does not say so by itself:
their params and tags are in the config and environment diffs, among every other key. So each
pair's request shape is compared here and a difference is said in one line above the figures.

The shape, per run: experiment.load and the shared prefix (params), and what the run's tags say
its requests were (macro.input_len, macro.output_len, macro.trace, macro.sessions: the lengths'
distribution and centre, a file's or trace's sha256, the sessions' turns and think time), the
files' paths left out (the same file in another folder is the same workload; another file
with the same path is not: its digest says). A run from before those tags existed is compared
on the params they come from.
"""

from __future__ import annotations

from k25exp.tracking.read import RunView

SHAPE_TAGS = {"macro.input_len": "input lengths", "macro.output_len": "output lengths",
              "macro.trace": "trace", "macro.sessions": "sessions"}
SHAPE_PARAMS = {"experiment.load": "load", "experiment.prefix_tokens": "shared prefix tokens",
                "experiment.prefix_groups": "prefix groups"}
# without the tags: the params they are made of (a sweep's own axis, trace.speedup, is not shape)
PARAM_PREFIXES = ("experiment.input_tokens", "experiment.output_tokens", "experiment.input_len.",
                  "experiment.output_len.", "experiment.trace.", "experiment.sessions.")
NOT_SHAPE = ("experiment.trace.speedup",)
PATHS = ("experiment.trace.path", "experiment.input_len.path", "experiment.output_len.path")


def _tags(r: RunView) -> dict[str, str]:
    """The run's shape tags by their last name (a sub-run's `spec/macro.input_len` too)."""
    return {k.rsplit("/", 1)[-1]: v for k, v in r.tags.items() if k.rsplit("/", 1)[-1] in SHAPE_TAGS}


def _unpathed(value: str, paths: set[str]) -> str:
    for p in sorted(paths, key=len, reverse=True):
        value = value.replace(f"{p}: ", "").replace(f" from {p} ", " ")
    return value


def shape(r: RunView, paths: set[str]) -> dict[str, str]:
    """What the run's requests were: {what: value} (module docstring)."""
    out = {name: r.params[k] for k, name in SHAPE_PARAMS.items() if k in r.params}
    tags = _tags(r)
    if "macro.input_len" in tags:
        out.update({name: _unpathed(tags[k], paths) if k in tags else "(none)"
                    for k, name in SHAPE_TAGS.items()})
    else:
        out.update({k: v for k, v in r.params.items() if k.startswith(PARAM_PREFIXES)
                    and k not in NOT_SHAPE and k not in PATHS})
    return out


def differences(a: RunView, b: RunView) -> list[tuple[str, str, str]]:
    """(what, A's, B's) for every part of the request shape the two runs differ in."""
    paths = {r.params[k] for r in (a, b) for k in PATHS if r.params.get(k) not in (None, "None")}
    sa, sb = shape(a, paths), shape(b, paths)
    return [(k, sa.get(k, "(absent)"), sb.get(k, "(absent)")) for k in dict.fromkeys([*sa, *sb])
            if sa.get(k) != sb.get(k)]


def shape_notes(pairs) -> list[str]:
    """One line per distinct difference in request shape, naming the pairs that have it."""
    by_diff: dict[tuple, list[str]] = {}
    for p in pairs:
        d = differences(p.a, p.b)
        if d:
            by_diff.setdefault(tuple(d), []).append(p.label)
    return [f"the requests differ ({', '.join(labels)}): "
            + "; ".join(f"{what}: A `{x}`, B `{y}`" for what, x, y in diff)
            + ". A and B did not send the same requests: their latencies and throughputs differ "
            "by the workload as well as by the server (each level's input_len_mean and "
            "output_len_mean say what it sent)" for diff, labels in by_diff.items()]
