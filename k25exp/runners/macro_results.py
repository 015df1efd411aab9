"""What a macro job leaves after its levels: summary figures, the result table and plots,
from the levels measured so far (also when the job fails part way)."""

from __future__ import annotations

from pathlib import Path

import orjson

from k25exp import plots, tables
from k25exp.config.experiments import MacroConfig
from k25exp.load.level_figures import invalid_reason, saturation
from k25exp.load.sessions import write_turn_results
from k25exp.stats import suppressed
from k25exp.tracking.recorder import Recorder

COLUMNS = [
    tables.Column("conc", "{}", 6), tables.Column("reqs", "{}", 6), tables.Column("err", "{}", 5),
    tables.Column("tok/s", "{:.1f}", 10), tables.Column("req/s", "{:.2f}", 8),
    tables.Column("ttft_p50", "{:.1f}", 10), tables.Column("ttft_p99", "{:.1f}", 10),
    tables.Column("tpot_p50", "{:.2f}", 10), tables.Column("tpot_p99", "{:.2f}", 10),
    tables.Column("srv_tpot", "{:.2f}", 10), tables.Column("itl_p50", "{:.2f}", 9),
    tables.Column("itl_p99", "{:.2f}", 9), tables.Column("e2e_p50", "{:.0f}", 9),
    tables.Column("lag_p99", "{:.2f}", 10), tables.Column("loop", "{:.2f}", 7),
    tables.Column("cpu", "{:.2f}", 6), tables.Column("stalls", "{:.0f}", 7),
    tables.Column("stall_max", "{:.0f}", 10), tables.Column("tpot_nostall", "{:.2f}", 13),
    tables.Column("valid", "{:.0f}", 6), tables.Column("why", "{}", 29),
]
ROW_KEYS = ["requests", "errors", "output_tok_s", "request_s", "ttft_ms_p50", "ttft_ms_p99",
            "tpot_ms_p50", "tpot_ms_p99", "server_tpot_ms_mean", "itl_ms_p50", "itl_ms_p99",
            "e2e_ms_p50", "client_lag_ms_p99", "client_loop_lag_ms_mean", "client_cpu_util",
            "delivery_stalls", "delivery_stall_ms_max", "tpot_ms_mean_no_stalls", "valid"]


def row(level: float, figs: dict) -> list:
    """A level's row of the result table: a percentile too few samples allow reads 'n<N';
    the send lag's p99, where under 100 sends allow none, reads 'max X' (what was judged)."""
    def cell(k: str):
        if k == "client_lag_ms_p99" and k not in figs and "client_lag_ms_max" in figs:
            return f"max {figs['client_lag_ms_max']:.2f}"
        return figs.get(k, suppressed(figs, k))
    return [level] + [cell(k) for k in ROW_KEYS] + [invalid_reason(figs) or None]


def finish(out: Path, exp: MacroConfig, rows: list, measured: list, summary: dict,
            rec: Recorder, jsonl) -> None:
    """Summary figures, table and plots from the levels measured so far."""
    jsonl.close()
    if not measured:
        return
    levels = [c for c, _ in measured]
    tput = [f["output_tok_s"] for _, f in measured]
    peak_i = max(range(len(tput)), key=tput.__getitem__)
    sat = saturation(levels, tput, exp.saturation_gain)
    unit = {"open": "rate", "trace": "speedup"}.get(exp.load, "concurrency")
    s = {"peak_output_tok_s": tput[peak_i], f"peak_{unit}": levels[peak_i],
         "invalid_levels": sum(1 for _, f in measured if not f["valid"]),
         "stalled_levels": sum(1 for _, f in measured if f["delivery_stalls"]),
         "sweep_errors": sum(f["errors"] for _, f in measured)}
    if sat is not None:
        s[f"saturation_{unit}"] = sat
    rec.log_metrics(s)
    rec.set_tags({"saturation": str(sat) if sat is not None else
                  f"none within the sweep (throughput still grew by more than "
                  f"{exp.saturation_gain:.0%} at its last step)"})
    summary.update(s)
    good = [f.get("good_fraction") for _, f in measured]
    if exp.slo.bounds():
        s_good = {"max_good_fraction": max(g for g in good if g is not None)} if any(
            g is not None for g in good) else {}
        rec.log_metrics(s_good)
        summary.update(s_good)
    cols = COLUMNS if exp.load in ("closed", "sessions") else [
        tables.Column("speedup" if exp.load == "trace" else "rate/s", "{:g}", 8)] + COLUMNS[1:]
    text = tables.write(out / "results", cols, rows,
                        f"macro: {_shape(exp)}; ms "
                        "except tok/s, req/s; srv_tpot = server's mean; lag = client send lag (p99, or its max under 100 sends); "
                        "loop = client loop lag (mean); cpu = client cores busy; stalls = delivery "
                        "stalls (tokens held back, released in a burst), stall_max their longest "
                        "silence; tpot_nostall = mean TPOT of the requests no stall touched; "
                        "n<N = too few samples for that percentile")
    print(text, flush=True)
    if exp.load == "sessions":
        print(write_turn_results(out, measured), flush=True)
    pdir = out / "plots"
    xname = {"open": "request rate (req/s)", "trace": "trace speedup"}.get(exp.load, "concurrency")
    flagged = [t if not f["valid"] else None for t, (_, f) in zip(tput, measured)]
    plots.sweep(pdir / "throughput_vs_concurrency.png", levels,
                {"output tok/s": tput, "invalid: client lag or delivery stall": flagged},
                xname, "output tokens / s", f"Throughput vs {xname}",
                vline=sat, vline_label=f"saturation (gain < {exp.saturation_gain:.0%})")
    plots.sweep(pdir / "tpot_vs_concurrency.png", levels,
                {k: [f.get(f"tpot_ms_{k}") for _, f in measured] for k in ("p50", "p90", "p99")}
                | {"server mean": [f.get("server_tpot_ms_mean") for _, f in measured]},
                xname, "TPOT (ms)", f"TPOT vs {xname} (vLLM definition)")
    cdf_plot(pdir / "latency_cdf.png", out / "requests.jsonl")


def _shape(exp: MacroConfig) -> str:
    """The requests' lengths, for the table's header."""
    if exp.load == "trace":
        return f"the requests of trace {exp.trace.path}"
    if exp.load == "sessions":
        x = exp.sessions
        return (f"sessions of {x.turns} turns, each on its history + a message of "
                f"{'' if exp.input_len.dist == 'fixed' else 'mean '}{exp.input_tokens} tokens, "
                f"answers of {'' if exp.output_len.dist == 'fixed' else 'mean '}"
                f"{exp.output_tokens}")

    def one(x, n: int, what: str) -> str:
        return f"{n} {what}" if x.dist == "fixed" else f"{what} {x.dist}, mean {n}"
    return (f"{one(exp.input_len, exp.input_tokens, 'in')} / "
            f"{one(exp.output_len, exp.output_tokens, 'out')} tokens")


def cdf_plot(path: Path, jsonl: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_level: dict[int, list[dict]] = {}
    for line in jsonl.read_bytes().splitlines():
        r = orjson.loads(line)
        if r["phase"] == "sweep" and r["ok"]:
            by_level.setdefault(r["level"], []).append(r)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, key, label in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "end-to-end")):
        for c in sorted(by_level):
            xs = sorted(r[key] * 1e3 for r in by_level[c] if r[key] is not None)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"c={c}")
        ax.set(xlabel=f"{label} (ms)", ylabel="fraction of requests", title=f"{label} CDF")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- a killed job's figures, from its folder -------------------------------------------------

RECOVERED_VALIDITY = "k25exp.recovered_validity"  # which levels' validity is unknown
# A recovered level's health figures: the client's loop lag and CPU use were not kept, so
# nothing shows it kept up; these are never logged as if it had (nor the lag verdict's count,
# taken against no rule's limit).
UNKNOWN_HEALTH = ("valid", "client_lagged", "client_late_sends")


def recover(out: Path, run) -> str:
    """A killed job's figures (`k25exp recover`): per-level figures (k25exp.load.level_figures) of
    every level requests.jsonl holds: the
    job writes a level's records once the level is over, so these are the finished ones.
    The server's /metrics view and the client's CPU and loop lag were not kept: absent. So a
    level's validity is unknown: `valid` is logged only as 0, where the records themselves
    show a delivery stall; otherwise `valid` and `client_lagged` are left out and the tag
    k25exp.recovered_validity names the levels."""
    from k25exp.collectives.results import read_jsonl  # a torn last line tolerated, as for ranks
    from k25exp.load.level_figures import level_figures

    if not (out / "requests.jsonl").exists():
        return "nothing: no requests.jsonl"
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in read_jsonl(out / "requests.jsonl"):
        groups.setdefault((r["phase"], r["level"]), []).append(r)
    levels, tput, unknown, stalled = [], [], [], []
    for (phase, level), recs in groups.items():
        if phase == "warmup":
            continue
        sent = [r for r in recs if r.get("sent_s") is not None]  # not a failed process's unsent
        if not sent:
            continue
        wall = max(r["sent_s"] + r["end_s"] for r in sent) - min(r["sent_s"] for r in sent)
        figs = {k: v for k, v in level_figures(recs, wall).items() if isinstance(v, (int, float))
                and k not in UNKNOWN_HEALTH}
        what = "single stream" if phase == "single" else f"{level}"
        if figs.get("delivery_stalls"):
            figs["valid"] = 0.0  # seen in the records: invalid whatever the client did
            stalled.append(what)
        else:
            unknown.append(what)
        if phase == "single":
            single = {f"single_stream_{k}": v for k, v in figs.items()}
            if "tpot_ms_p50" in figs:  # the job's headline names
                single["single_stream_tpot_ms"] = figs["tpot_ms_p50"]
            if "ttft_ms_p50" in figs:
                single["single_stream_ttft_ms"] = figs["ttft_ms_p50"]
            run.log_metrics(single)
        else:
            run.log_metrics(figs, step=level)
            levels.append(level)
            tput.append(figs["output_tok_s"])
    summary = {}
    if levels:
        i = max(range(len(levels)), key=tput.__getitem__)
        summary = {"peak_output_tok_s": tput[i], "peak_concurrency": levels[i]}
        run.log_metrics(summary)
        plots.sweep(out / "plots" / "throughput_vs_concurrency.png", levels,
                    {"output tok/s": tput}, "concurrency", "output tokens / s",
                    "Throughput vs concurrency (recovered: finished levels)")
    if unknown or stalled:
        run.set_tags({RECOVERED_VALIDITY: _validity_note(unknown, stalled)})
    single = ("single-stream phase, " if any(p == "single" for p, _ in groups) else "")
    return (f"macro: {single}{len(levels)} finished concurrency level(s) {levels} from "
            "requests.jsonl by k25exp.load.level_figures.level_figures (no server /metrics, client "
            "CPU or loop-lag figures); plots/throughput_vs_concurrency.png")


def _validity_note(unknown: list[str], stalled: list[str]) -> str:
    def named(xs: list[str]) -> str:
        lv = [x for x in xs if x != "single stream"]
        return ", ".join((["the single stream"] if "single stream" in xs else [])
                         + ([f"levels [{', '.join(lv)}]"] if lv else []))
    parts = []
    if unknown:
        parts.append(f"validity unknown for {named(unknown)}: the client's loop lag and CPU use "
                     "were not kept, so recovery logs no valid/client_lagged for them (a verdict "
                     "the job flushed itself before it died stands)")
    if stalled:
        parts.append(f"valid=0 for {named(stalled)}: a delivery stall in the records")
    return "; ".join(parts)
