"""What a macro job leaves after its levels: summary figures, the result table and plots,
from the levels measured so far (also when the job fails part way)."""

from __future__ import annotations

from pathlib import Path

import orjson

from k25exp import plots, tables
from k25exp.config.schema import MacroConfig
from k25exp.serving.figures import invalid_reason, saturation
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
    unit = "rate" if exp.load == "open" else "concurrency"
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
    cols = COLUMNS if exp.load == "closed" else [tables.Column("rate/s", "{:g}", 8)] + COLUMNS[1:]
    text = tables.write(out / "results", cols, rows,
                        f"macro: {exp.input_tokens} in / {exp.output_tokens} out tokens; ms "
                        "except tok/s, req/s; srv_tpot = server's mean; lag = client send lag (p99, or its max under 100 sends); "
                        "loop = client loop lag (mean); cpu = client cores busy; stalls = delivery "
                        "stalls (tokens held back, released in a burst), stall_max their longest "
                        "silence; tpot_nostall = mean TPOT of the requests no stall touched; "
                        "n<N = too few samples for that percentile")
    print(text, flush=True)
    pdir = out / "plots"
    xname = "request rate (req/s)" if exp.load == "open" else "concurrency"
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
