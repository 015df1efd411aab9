"""How a serving level's client lag is judged (experiment.validity): the rule by name and its
constants. The judgement itself is k25exp.load.validity.

Two rules, named so a stored run keeps its meaning (each run's tag macro.validity says which
judged it; a run without the tag was judged by `absolute`, the only rule before this key):
  relative  a send is late when it left at least lag_frac of the level's own step (its mean
            ITL; an SLO probe's: the SLO's tightest bound) after it was due, and the level
            lagged when more than `tail` of its sends, and at least min_late of them, were
            late; or its event loop's mean wake-up lag reached that fraction of the step; or
            its CPU passed 90 % of a core
  absolute  the send lag's p99 (its max under 100 sends) or the mean loop lag above
            experiment.max_client_lag_ms (20 ms), or the CPU above 90 % of a core
"""

from __future__ import annotations

from dataclasses import dataclass

RULES = ("relative", "absolute")


@dataclass
class ValidityConfig:
    """The client-lag rule a level is judged by (k25exp.load.validity)."""

    rule: str = "relative"  # relative | absolute (the module docstring says what each does)
    # relative: a send (or the mean loop wake-up) late by at least this fraction of the step.
    # From half a step on, a send more often than not misses the step it was due for.
    lag_frac: float = 0.5
    # relative: the level lagged when more than this share of its sends were late (the p99's
    # tail: with 100 sends or more, about "the p99 send was late")...
    tail: float = 0.01
    # ...and at least this many: one late wake-up is not a level's verdict (a 12-request
    # level is otherwise voided by one send; its p99 would be that send).
    min_late: int = 2
    # A level shared its host when processes outside this job's tree and the served engine's
    # used more than this many cores on average while it ran (k25exp.telemetry.host_cpu): a
    # verdict of its own (host_shared), not part of `valid`; spec_decode leaves such rounds
    # out. A quiet 2-core machine's daemons use ~0.003 cores; one busy neighbour up to 1.
    host_other_cores_max: float = 0.25

    def problems(self, key: str, problems: list[str]) -> None:
        """Its values, each bad one named with its key and what was expected."""
        if self.rule not in RULES:
            problems.append(f"{key}.rule={self.rule!r}: expected one of {', '.join(RULES)}")
        if not self.lag_frac > 0:
            problems.append(f"{key}.lag_frac={self.lag_frac}: expected a fraction of the level's "
                            "step > 0")
        if not 0 <= self.tail < 1:
            problems.append(f"{key}.tail={self.tail}: expected a share of the sends, 0 <= x < 1")
        if not self.host_other_cores_max > 0:
            problems.append(f"{key}.host_other_cores_max={self.host_other_cores_max}: expected "
                            "cores > 0 (the other processes' mean CPU use a level tolerates)")
        if self.min_late < 1:
            problems.append(f"{key}.min_late={self.min_late}: expected >= 1 late sends")
