"""Multi-turn sessions (experiment.load=sessions): conversations of experiment.sessions.turns
turns, `concurrency` of them in flight, each turn sent on the session's whole history.

A turn's prompt is token ids (the completions API's `prompt` takes a list of them):
    turn 1      a prompt of its drawn length, built as every macro prompt is (k25exp.load.
                prompts: the tokenizer's special tokens counted; a group's shared prefix with
                experiment.prefix_tokens)
    turn t > 1  turn t − 1's prompt, then the token ids the server answered (vLLM's
                return_token_ids), then a new message of its drawn length (its own tokens,
                no special tokens)
so prompt_tokens(t) = prompt_tokens(t − 1) + answer_tokens(t − 1) + message_tokens(t) exactly,
and the history is the very tokens the server computed KV for: a prefix cache finds every
earlier turn, as it would behind a chat template (AIPerf's and vLLM's multi-turn benchmarks
send chat messages; re-tokenising a decoded answer can split it otherwise and drops special
tokens such as an EOS that ignore_eos let through, so the history is sent as ids).
Session s's turn t is request index s × turns + t − 1 of experiment.input_len / output_len
(k25exp.load.lengths): its message and answer lengths depend on the seed, s and t alone, the
same at every level. Its message text is prompt SESSION_PROMPTS + that index.
Think time: before each turn after the first, from the end of the answer before it:
think_time_s (fixed), or drawn from numpy.random.default_rng([seed, THINK_STREAM, s])
.exponential(think_time_s, turns − 1) (exponential). The first turn has none (AIPerf's turn
delay is also applied between turns only).
Closed loop: each of the `concurrency` workers runs one session at a time, all its turns, then
claims the next; a turn's scheduled send is the end of the answer before it plus its think
time (the next session's first turn: the end of the last one's last answer), so lag_ms is the
client's own lateness, as in k25exp.load.client.run_level. A turn that fails ends its session
(its history is broken): the session counts in sessions_cut.

Each record carries its session (the session's index: repeat r's sessions are numbered on from
r × the level's sessions), its turn (1-based), its think_s, and prompt_tokens_target (the
history's length); `session_figures` gives the per-turn TTFT and the session counts.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from k25exp.config.experiments.request_shapes import SessionConfig
from k25exp.load.client import Counter, LoopLag, _result, _start
from k25exp.load.lengths import Lengths
from k25exp.load.prompts import PromptBuilder
from k25exp.stats import mean, min_samples, percentile

THINK_STREAM = 2  # after lengths' input (0) and output (1) streams
SESSION_PROMPTS = 3_000_000  # a session message's text is prompt index SESSION_PROMPTS + its request index
TTFT_PERCENTILES = (50, 99)


def think_times(cfg: SessionConfig, seed: int, session: int) -> list[float]:
    """The pauses (s) before turns 2 … turns of session `session`."""
    n = max(cfg.turns - 1, 0)
    if cfg.think_dist == "exponential":
        rng = np.random.default_rng([seed, THINK_STREAM, session])
        return [float(x) for x in rng.exponential(cfg.think_time_s, n)]
    return [float(cfg.think_time_s)] * n


class SessionPlan:
    """What each session sends: its turns' messages (token ids), answer lengths and pauses.
    `builder` builds turn 1 (with its shared prefix, if any); later messages come from a
    builder without one. Messages are built once and kept (`prepare` builds them ahead, so
    no tokenizing happens while a level is timed)."""

    def __init__(self, tok, builder: PromptBuilder, inputs: Lengths, outputs: Lengths,
                 cfg: SessionConfig, seed: int):
        self.tok, self.builder, self.inputs, self.outputs = tok, builder, inputs, outputs
        self.cfg, self.seed, self.turns = cfg, seed, cfg.turns
        self.plain = PromptBuilder(tok, builder.length, seed)  # no shared prefix
        self._messages: dict[tuple[int, int], list[int]] = {}

    def index(self, session: int, turn: int) -> int:
        """The request index of session `session`'s turn `turn` (1-based)."""
        return session * self.turns + turn - 1

    def message(self, session: int, turn: int) -> list[int]:
        """The token ids turn `turn` adds: the whole first prompt, or a later turn's message."""
        key = (session, turn)
        if key not in self._messages:
            i = self.index(session, turn)
            n = self.inputs(i)
            if turn == 1:
                text = self.builder.build(SESSION_PROMPTS + i, n)
                ids = self.tok(text, add_special_tokens=True)["input_ids"]
            else:  # n tokens of its own: built n + the special tokens long, encoded without them
                text = self.plain.build(SESSION_PROMPTS + i, n + self.plain.overhead)
                ids = self.tok(text, add_special_tokens=False)["input_ids"]
            if len(ids) != n:
                raise ValueError(f"session {session} turn {turn}: a message of {n} tokens encoded "
                                 f"to {len(ids)} (the tokenizer adds special tokens other than at "
                                 "the start?)")
            self._messages[key] = list(ids)
        return self._messages[key]

    def max_tokens(self, session: int, turn: int) -> int:
        return self.outputs(self.index(session, turn))

    def think_s(self, session: int) -> list[float]:
        return think_times(self.cfg, self.seed, session)

    def prepare(self, sessions: Sequence[int]) -> None:
        for s in sessions:
            for t in range(1, self.turns + 1):
                self.message(s, t)

    def shipped(self, sessions: Sequence[int]) -> "ShippedSessions":
        """What `sessions` send, without the tokenizer: for client processes
        (k25exp.load.shards), which take it whole."""
        ts = range(1, self.turns + 1)
        return ShippedSessions(self.turns, {(s, t): self.message(s, t) for s in sessions for t in ts},
                               {(s, t): self.max_tokens(s, t) for s in sessions for t in ts},
                               {s: self.think_s(s) for s in sessions})


class ShippedSessions:
    """SessionPlan's answers for a fixed set of sessions (messages built, lengths and think
    times drawn): what a client process needs, picklable."""

    def __init__(self, turns: int, messages: dict, max_tokens: dict, think: dict) -> None:
        self.turns, self._messages, self._max, self._think = turns, messages, max_tokens, think

    def message(self, session: int, turn: int) -> list[int]:
        return self._messages[session, turn]

    def max_tokens(self, session: int, turn: int) -> int:
        return self._max[session, turn]

    def think_s(self, session: int) -> list[float]:
        return self._think[session]


async def run_session_level(client, plan: SessionPlan, *, phase: str, level: int,
                            concurrency: int, n_sessions: int, t0: float, first_session: int = 0,
                            on_record: Optional[Callable[[dict], None]] = None,
                            should_stop: Optional[Callable[[], bool]] = None,
                            ramp_s: float = 0.0, workers: Optional[Sequence[int]] = None,
                            counter=None, start_at: Optional[float] = None,
                            shard: int = 0) -> dict:
    """`n_sessions` sessions (first_session, first_session + 1, …), `concurrency` in flight,
    as the module docstring says. Returns as k25exp.load.client.run_level. A shard of
    sessions that several client processes run (k25exp.load.shards) runs only `workers`,
    claims sessions from the shared `counter` and starts at the shared `start_at`, as
    run_level's shards do."""
    records: list[dict] = []
    counter = counter or Counter()
    start = await _start(start_at)
    cpu0 = time.process_time()
    lag = LoopLag()
    lag.start()
    turns = plan.turns

    async def worker(w: int) -> None:
        scheduled = start + w * ramp_s / concurrency
        while True:
            if should_stop and should_stop():
                return
            k = counter.claim(n_sessions)
            if k is None:
                return
            s = first_session + k
            pauses = [0.0] + plan.think_s(s)
            history: list[int] = []
            for t in range(1, turns + 1):
                scheduled += pauses[t - 1]
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if should_stop and should_stop():
                    return
                prompt = history + plan.message(s, t)
                answer: list[int] = []
                rec = {"phase": phase, "level": level, "i": k * turns + t - 1, "worker": w,
                       "shard": shard, "session": s, "turn": t, "think_s": pauses[t - 1],
                       "prompt_tokens_target": len(prompt), "max_tokens": plan.max_tokens(s, t),
                       "scheduled_s": scheduled - t0}
                await client.complete(prompt, rec["max_tokens"], rec, t0, answer=answer)
                if rec["ok"] and len(answer) != rec["output_tokens"]:
                    rec["error"] = (f"session: {len(answer)} answer token ids streamed for "
                                    f"{rec['output_tokens']} output tokens (the history needs "
                                    "vLLM's return_token_ids)")
                    rec["ok"] = False
                records.append(rec)
                if on_record:
                    on_record(rec)
                scheduled = t0 + rec["sent_s"] + rec["end_s"]
                if not rec["ok"]:
                    break  # the history is broken: the session ends here
                history = prompt + answer

    await asyncio.gather(*(worker(w) for w in (range(concurrency) if workers is None else workers)))
    return _result(records, start, cpu0, await lag.stop())


def session_figures(records: Sequence[dict], turns: int) -> dict[str, float]:
    """Per turn k (1-based), over the level's records of that turn: turn<k>_ttft_ms_p50 / _p99
    (where the samples allow: k25exp.stats.min_samples), _mean and _n (the successful turns
    they are over), turn<k>_prompt_tokens_mean (the history sent, every turn sent); the level's
    sessions, sessions_completed (every turn answered), sessions_cut (the rest) and
    think_s_mean (over the turns after the first)."""
    out: dict[str, float] = {}
    by_turn: dict[int, list[dict]] = {}
    by_session: dict[int, list[dict]] = {}
    for r in records:
        if r.get("turn") is None:
            continue
        by_turn.setdefault(r["turn"], []).append(r)
        by_session.setdefault(r["session"], []).append(r)
    for k in sorted(by_turn):
        rs = by_turn[k]
        ttft = [r["ttft_s"] for r in rs if r["ok"] and r.get("ttft_s") is not None]
        if ttft:
            out.update({f"turn{k}_ttft_ms_p{q}": percentile(ttft, q) * 1e3
                        for q in TTFT_PERCENTILES if len(ttft) >= min_samples(q)})
            out[f"turn{k}_ttft_ms_mean"] = mean(ttft) * 1e3
        out[f"turn{k}_ttft_ms_n"] = len(ttft)
        out[f"turn{k}_prompt_tokens_mean"] = mean([r["prompt_tokens_target"] for r in rs])
    done = sum(1 for rs in by_session.values() if len(rs) == turns and all(r["ok"] for r in rs))
    out.update(sessions=len(by_session), sessions_completed=done, sessions_cut=len(by_session) - done)
    thinks = [r["think_s"] for r in records if r.get("turn", 1) > 1 and r.get("think_s") is not None]
    if thinks:
        out["think_s_mean"] = mean(thinks)
    return out


def turns_of(figs: dict) -> list[int]:
    """The turn indices a level's figures hold."""
    return sorted(int(k[4:-len("_ttft_ms_n")]) for k in figs
                  if k.startswith("turn") and k.endswith("_ttft_ms_n"))


def prefix_cache_state(figs: dict) -> str:
    """What the server's prefix cache did over a level, in words: its hit rate, or that
    caching was off (vLLM's CPU build for an MLA model), or that /metrics said nothing."""
    if figs.get("prefix_caching_enabled") == 0:
        return "prefix caching off on the server"
    if figs.get("prefix_cache_hit_rate") is not None:
        return (f"prefix-cache hit rate {figs['prefix_cache_hit_rate']:.1%} "
                f"({figs['prefix_cache_hits']:.0f} of {figs['prefix_cache_queries']:.0f} tokens)")
    return "prefix-cache hit rate unknown (no counters on /metrics)"



def write_turn_results(out: Path, measured: Sequence[tuple[int, dict]]) -> str:
    """results_turns.txt/.csv (a row per level and turn) and plots/ttft_by_turn.png (TTFT p50
    by turn, a line per level), each level labelled with what its prefix cache did. Returns
    the table's text."""
    from k25exp import plots, tables

    cols = [tables.Column("conc", "{}", 6), tables.Column("turn", "{}", 5),
            tables.Column("n", "{:.0f}", 5), tables.Column("ttft_p50", "{:.1f}", 10),
            tables.Column("ttft_p99", "{:.1f}", 10), tables.Column("ttft_mean", "{:.1f}", 10),
            tables.Column("prompt_tok", "{:.1f}", 11)]
    rows, series = [], {}
    for c, figs in measured:
        ks = turns_of(figs)
        rows += [[c, k] + [figs.get(f"turn{k}_{x}") for x in (
            "ttft_ms_n", "ttft_ms_p50", "ttft_ms_p99", "ttft_ms_mean", "prompt_tokens_mean")]
                 for k in ks]
        series[f"c={c}: {prefix_cache_state(figs)}"] = [figs.get(f"turn{k}_ttft_ms_p50") for k in ks]
    states = "; ".join(f"c={c}: {prefix_cache_state(f)}" for c, f in measured)
    off = any(f.get("prefix_caching_enabled") == 0 for _, f in measured)
    why = (" (vLLM's CPU build turns prefix caching off for an MLA model such as the tiny Kimi "
           "unless its AMX MLA path runs: no hit rate, later turns prefill their whole history)"
           if off else "")
    text = tables.write(out / "results_turns", cols, rows,
                        "macro sessions: TTFT by turn, ms; n = turns answered (p99 with >= 100 "
                        "only); prompt_tok = mean history sent (tokens); " + states + why)
    turns = sorted({k for _, f in measured for k in turns_of(f)})
    title = "TTFT by turn (p50)" + (" — prefix caching OFF on the server" if off else "")
    plots.sweep(out / "plots" / "ttft_by_turn.png", turns,
                {name: ys + [None] * (len(turns) - len(ys)) for name, ys in series.items()},
                "turn", "TTFT p50 (ms)", title, logx=False)
    return text
