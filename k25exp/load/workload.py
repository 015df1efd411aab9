"""What a macro job sends: each request's prompt with the lengths it was drawn with
(experiment.input_len / output_len: k25exp.load.lengths), the trace line it replays
(experiment.load=trace: k25exp.load.trace) or the session turn it is (experiment.load=sessions:
k25exp.load.sessions), read and checked before the server starts.

A prompt source is called with a request index and gives (text, prompt tokens, max_tokens);
the client writes both lengths into the request's record (prompt_tokens_target, max_tokens).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from k25exp.config.validate import ConfigError
from k25exp.load.lengths import LengthFileError, Lengths, read_lengths
from k25exp.load.prompts import PromptBuilder
from k25exp.load.sessions import SessionPlan
from k25exp.load.trace import Trace, TraceError, read_trace, too_long

if TYPE_CHECKING:
    from k25exp.config.experiments import MacroConfig
    from k25exp.config.schema import ServerConfig

TRACE_PROMPTS = 2_000_000  # a trace line's own words are drawn as prompt index TRACE_PROMPTS + line
MAX_LISTED = 20


class ShapedPrompts:
    """Prompt i of its drawn length, and the output length drawn for it."""

    def __init__(self, builder: PromptBuilder, inputs: Lengths, outputs: Lengths):
        self.builder, self.inputs, self.outputs = builder, inputs, outputs

    def __call__(self, i: int) -> tuple[str, int, int]:
        n = self.inputs(i)
        return self.builder.build(i, n), n, self.outputs(i)

    def many(self, indices: Sequence[int]) -> list:
        return [self(i) for i in indices]


class TracePrompts:
    """Request i replays the trace's line i mod its length (every repeat of a level the
    same requests): a prompt of its input_length built from its hash_ids' blocks."""

    def __init__(self, builder: PromptBuilder, trace: Trace):
        self.builder, self.trace = builder, trace

    def __call__(self, i: int) -> tuple[str, int, int]:
        k = i % len(self.trace)
        r = self.trace.requests[k]
        try:
            text = self.builder.build(TRACE_PROMPTS + k, r.input_length, r.hash_ids,
                                      self.trace.block_tokens)
        except ValueError as e:
            raise ConfigError(f"{self.trace.path}:{r.line}: input_length={r.input_length}: {e}; "
                              f"expected at least {self.builder.overhead + 1} (the served "
                              "tokenizer's special tokens and one of its own)") from None
        return text, r.input_length, r.output_length

    def many(self, indices: Sequence[int]) -> list:
        return [self(i) for i in indices]


class Workload:
    """The files a job's requests come from, read and checked (ConfigError naming every
    problem: a bad line of a lengths file or trace, a request that cannot fit the launched
    server's max_model_len), before anything is started or sent."""

    def __init__(self, exp: MacroConfig, server: Optional[ServerConfig] = None):
        self.exp = exp
        problems: list[str] = []
        self.values = {}  # an empirical shape's lengths, by stream
        for stream, shape in (("input", exp.input_len), ("output", exp.output_len)):
            if shape.dist == "empirical":
                try:
                    self.values[stream] = read_lengths(shape.path, f"experiment.{stream}_len.path")
                except LengthFileError as e:
                    problems.append(str(e))
        self.trace: Optional[Trace] = None
        if exp.load == "trace":
            try:
                self.trace = read_trace(exp.trace.path, exp.trace.block_tokens)
            except TraceError as e:
                problems.append(str(e))
        mml = server.max_model_len if server is not None and server.kind == "vllm" else 0
        if not problems and mml > 0:
            problems += self._fit_problems(mml)
        if problems:
            raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))

    def lengths(self, stream: str, low: int = 1) -> Lengths:
        exp = self.exp
        shape, mean = ((exp.input_len, exp.input_tokens) if stream == "input"
                       else (exp.output_len, exp.output_tokens))
        return Lengths(shape, mean, exp.seed, stream, low=low, values=self.values.get(stream))

    def _fit_problems(self, mml: int) -> list[str]:
        """What the config check could not hold against max_model_len: shapes bounded only by
        their file or their max, and the trace's lines."""
        exp, out = self.exp, []
        tops = {s: self.lengths(s).upper() for s in ("input", "output")}
        for s, top in tops.items():
            shape = getattr(exp, f"{s}_len")
            if top is None:
                out.append(f"experiment.{s}_len.dist={shape.dist} has no upper bound: set "
                           f"experiment.{s}_len.max so that a prompt and its output fit "
                           f"server.max_model_len={mml}")
        # (a bounded shape's longest the config check held against it already)
        from_file = any(x.dist == "empirical" and x.max is None for x in (exp.input_len, exp.output_len))
        if not out and from_file and exp.load == "sessions":
            if (n := exp.sessions.longest(tops["input"], tops["output"])) > mml:
                out.append(f"experiment.sessions.turns={exp.sessions.turns} × (the longest message "
                           f"+ answer experiment.input_len and output_len can draw, {tops['input']} "
                           f"+ {tops['output']}) = {n} tokens exceeds server.max_model_len={mml}")
        elif not out and from_file and sum(tops.values()) > mml:
            out.append(f"the longest prompt + output experiment.input_len and output_len can "
                       f"draw, {tops['input']} + {tops['output']} = {sum(tops.values())}, exceeds "
                       f"server.max_model_len={mml}")
        if self.trace is not None:
            n = exp.requests
            bad = too_long(Trace(self.trace.path, self.trace.requests[:n], self.trace.block_tokens), mml)
            out += bad[:MAX_LISTED] + ([f"(and {len(bad) - MAX_LISTED} more lines too long)"]
                                       if len(bad) > MAX_LISTED else [])
        return out

    def prompts(self, tok) -> tuple[ShapedPrompts, Optional[TracePrompts]]:
        """The job's prompt sources: the shaped one (warm-up, single stream, the sweep of a
        closed or open loop) and, with load=trace, the trace's (the sweep)."""
        exp = self.exp
        builder = PromptBuilder(tok, exp.input_tokens, exp.seed, exp.prefix_tokens, exp.prefix_groups)
        shaped = ShapedPrompts(builder, self.lengths("input", builder.least()), self.lengths("output"))
        return shaped, TracePrompts(builder, self.trace) if self.trace is not None else None

    def sessions(self, tok) -> Optional[SessionPlan]:
        """With load=sessions, what each session sends (its messages built on demand:
        SessionPlan.prepare builds them ahead)."""
        exp = self.exp
        if exp.load != "sessions":
            return None
        builder = PromptBuilder(tok, exp.input_tokens, exp.seed, exp.prefix_tokens, exp.prefix_groups)
        return SessionPlan(tok, builder, self.lengths("input", builder.least()),
                           self.lengths("output"), exp.sessions, exp.seed)

    def describe(self) -> dict[str, str]:
        """Tags: what the lengths were drawn from, and the trace replayed (its digest)."""
        exp = self.exp

        def shape(s: str) -> str:
            x, mean = (exp.input_len, exp.input_tokens) if s == "input" else (exp.output_len,
                                                                            exp.output_tokens)
            if x.dist == "fixed":
                return f"fixed {mean}"
            if x.dist == "empirical":
                what = (f"empirical, {len(self.values[s])} lengths from {x.path} "
                        f"(sha256 {_digest(x.path)})")
            else:
                what = f"{x.dist}, mean {mean}, " + {"uniform": f"range_ratio {x.range_ratio:g}",
                                                     "normal": f"stddev {x.stddev:g}",
                                                     "lognormal": f"sigma {x.sigma:g}"}[x.dist]
            return what + f", clipped to [{x.min}, {x.max if x.max else 'none'}]"
        tags = {"macro.input_len": shape("input"), "macro.output_len": shape("output")}
        if exp.load == "sessions":
            x = exp.sessions
            think = (f"{x.think_time_s:g} s" if x.think_dist == "fixed" else
                     f"exponential, mean {x.think_time_s:g} s (seeded per session)")
            count = x.count if x.count is not None else "max(c, ceil(the level's requests / turns))"
            tags["macro.sessions"] = (
                f"{x.turns} turns a session, {count} sessions a level; each turn's prompt the "
                "session's history as token ids (its first prompt, each answer, each new message) "
                f"+ a new message of input_len; think time before each later turn {think}")
        if self.trace is not None:
            t = self.trace
            tags["macro.trace"] = (f"{t.path}: {len(t)} requests over {t.due_s().max():.3f} s, "
                                   f"blocks of {t.block_tokens} tokens (sha256 {_digest(t.path)})")
        return tags


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(Path(path), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]
