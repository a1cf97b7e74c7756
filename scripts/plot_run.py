#!/usr/bin/python3
"""Plots Relay runs: metrics.png (losses, learning rate, throughput, gradient norm, memory from
metrics.jsonl) and, where a run has a trace.json, a Gantt chart of its pipeline coloured F/B/W as
in the Zero Bubble paper (arXiv:2401.10241). Matplotlib only (Debian's python3-matplotlib).

Usage: scripts/plot_run.py RUN_DIR [RUN_DIR ...] [--out DIR]
Several RUN_DIRs share one metrics.png (one colour per run). The Gantt chart is pipeline.png for a
single RUN_DIR and pipeline-<run name>.png per traced run when there are several.
"""
import argparse
import json
import math
import os
import sys
import tomllib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import EngFormatter, FuncFormatter, LogLocator, NullFormatter  # noqa: E402

RUN_COLOURS = plt.get_cmap("tab10").colors
MAX_TRACED_STEPS = 4  # a Gantt chart of more steps has boxes too thin to read

# op -> (legend label, colour). Compute ops fill the rank's row; the others sit on a thin sub-row.
OPS = {
    "forward": ("F: forward", "#4a7fc1"),
    "backward": ("B: backward (input + weight)", "#3f9b4f"),
    "backward_input": ("B: backward, input gradient", "#7cc47f"),
    "backward_weight": ("W: backward, weight gradient", "#f0a040"),
    "optimizer_step": ("optimizer step", "#9467bd"),
    "eval": ("eval", "#c9a0dc"),
    "checkpoint": ("checkpoint", "#8c564b"),
    "recv_activation": ("wait: activation", "#b8b8b8"),
    "recv_grad": ("wait: gradient", "#8a8a8a"),
    "allreduce_grads": ("gradient all-reduce", "#505050"),
    "reduce_tied_grads": ("tied-embedding reduce", "#2f4f6f"),
    "data_wait": ("wait: input data", "#d8b878"),
}
OTHER_OP = ("other", "#e377c2")


# ---------------------------------------------------------------------------------------- runs
class Run:
    """One run directory: its train and eval records (one per step, the last written wins) and
    the samples (or tokens) one optimizer step consumes, from config.toml."""

    def __init__(self, path, name):
        self.path, self.name = path, name
        metrics = os.path.join(path, "metrics.jsonl")
        if not os.path.isfile(metrics):
            raise SystemExit(f"plot_run.py: {metrics}: no such file (is {path} a Relay run directory?)")
        train, evals = {}, {}
        with open(metrics) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a run still writing its last line
                    print(f"plot_run.py: {metrics}:{n}: skipping an unreadable line", file=sys.stderr)
                    continue
                if "step" not in rec:
                    continue
                if "loss" in rec:
                    train[rec["step"]] = rec
                if "eval_loss" in rec:
                    evals[rec["step"]] = rec
        if not train and not evals:
            raise SystemExit(f"plot_run.py: {metrics}: no train or eval records")
        self.train = [train[s] for s in sorted(train)]
        self.evals = [evals[s] for s in sorted(evals)]
        self.config = {}
        cfg = os.path.join(path, "config.toml")
        if os.path.isfile(cfg):
            with open(cfg, "rb") as f:
                self.config = tomllib.load(f)
        model, tr = self.config.get("model", {}), self.config.get("train", {})
        self.is_gpt = model.get("type") == "gpt" or any("tokens_per_s" in r for r in self.train)
        self.batch_size = tr.get("batch_size")
        self.block_size = model.get("block_size") if self.is_gpt else None

    def per_step(self, unit):
        """Samples or tokens per optimizer step, or None when config.toml does not say."""
        if self.batch_size is None:
            return None
        if unit == "tokens":
            return self.batch_size * self.block_size if self.block_size else None
        return self.batch_size

    def describe(self):
        m, tr, p = (self.config.get(k, {}) for k in ("model", "train", "parallel"))
        if not self.config:
            return self.name
        if self.is_gpt:
            model = (f"GPT {m.get('n_layer')} layers x {m.get('n_embd')} wide, "
                     f"context {m.get('block_size')}")
        else:
            model = f"MLP, {len(m.get('layers', []))} layers"
        dp, pp = p.get("dp", 1), p.get("pp", 1)
        layout = ("serial" if dp * pp == 1 else f"dp {dp} x pp {pp}"
                  + (f", {p.get('schedule', '1f1b')}" if pp > 1 else ""))
        return f"{self.name}: {model}; batch {tr.get('batch_size')}; {layout}"


def run_names(paths):
    """Directory names, lengthened with parent directories until they differ."""
    parts = [os.path.abspath(p).rstrip("/").split("/") for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return names


def series(records, key):
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in pts], [v for _, v in pts]


# ------------------------------------------------------------------------------------- metrics
def plot_metrics(runs, out):
    unit = "tokens" if all(r.is_gpt for r in runs) else "samples"
    fig, grid = plt.subplots(4, 2, figsize=(13, 12.5), constrained_layout=True,
                             gridspec_kw={"height_ratios": [0.06 + 0.05 * len(runs), 1, 1, 1]})
    header = grid[0, 0].get_gridspec()
    for ax in grid[0]:
        ax.remove()
    ax_runs = fig.add_subplot(header[0, :])
    ax_runs.axis("off")
    axes = grid[1:]
    (ax_loss, ax_seen), (ax_lr, ax_tput), (ax_norm, ax_mem) = axes
    losses = []
    for i, run in enumerate(runs):
        c = RUN_COLOURS[i % len(RUN_COLOURS)]
        ts, tl = series(run.train, "loss")
        es, el = series(run.evals, "eval_loss")
        losses += tl + el
        for ax, scale in ((ax_loss, 1), (ax_seen, run.per_step(unit))):
            if scale is None:
                continue
            ax.plot([s * scale for s in ts], tl, color=c, lw=1.4)
            ax.plot([s * scale for s in es], el, color=c, lw=1.4, ls="--", marker="o", ms=4)
        ax_lr.plot(*series(run.train, "lr"), color=c, lw=1.4)
        ax_tput.plot(*series(run.train, f"{unit}_per_s"), color=c, lw=1.2, marker=".", ms=3)
        ax_norm.plot(*series(run.train, "grad_norm"), color=c, lw=1.0, alpha=0.9)
        ax_mem.plot(*series(run.train, "rss_mib"), color=c, lw=1.4)
        ax_mem.plot(*series(run.train, "rss_max_mib"), color=c, lw=1.4, ls=":")

    styles = [Line2D([], [], color="k", lw=1.4, label="train loss")]
    if any(r.evals for r in runs):
        styles.append(Line2D([], [], color="k", lw=1.4, ls="--", marker="o", ms=4, label="eval loss"))
    for ax in (ax_loss, ax_seen):
        log_if_wide(ax, losses)
        ax.legend(handles=styles, loc="upper right")
    ax_loss.set(title="Loss", xlabel="step", ylabel="loss")
    ax_seen.set(title=f"Loss against {unit} seen", xlabel=f"{unit} (step x batch_size"
                + (" x block_size)" if unit == "tokens" else ")"), ylabel="loss")
    if not any(r.per_step(unit) for r in runs):
        note(ax_seen, "no config.toml: batch size unknown")
    ax_lr.set(title="Learning rate", xlabel="step", ylabel="lr")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    ax_tput.set(title=f"Throughput ({unit}/s)", xlabel="step",
                ylabel=f"{unit}/s")
    ax_seen.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax_tput.yaxis.set_major_formatter(EngFormatter(sep=""))
    if not log_if_wide(ax_tput, [v for r in runs for v in series(r.train, f"{unit}_per_s")[1]]):
        ax_tput.set_ylim(bottom=0)
    ax_norm.set(title="Gradient norm (global, before clipping)", xlabel="step", ylabel="L2 norm")
    ax_mem.set(title="Resident memory", xlabel="step", ylabel="MiB")
    if any(series(r.train, "rss_mib")[0] for r in runs):
        ax_mem.legend(handles=[Line2D([], [], color="k", lw=1.4, label="rank 0 (rss_mib)"),
                               Line2D([], [], color="k", lw=1.4, ls=":",
                                      label="largest rank (rss_max_mib)")], loc="best")
        # A flat line at 36 MiB should look flat: show at least 10% of the largest value.
        lo, hi = ax_mem.get_ylim()
        if hi - lo < 0.1 * hi:
            mid = (hi + lo) / 2
            ax_mem.set_ylim(mid - 0.05 * hi, mid + 0.05 * hi)
    else:
        note(ax_mem, "no rss_mib in metrics.jsonl")
    for ax in axes.flat:
        ax.grid(alpha=0.3)

    title = f"Relay run {runs[0].name}" if len(runs) == 1 else f"Relay: {len(runs)} runs compared"
    fig.suptitle(title, fontsize=15, fontweight="bold")
    ax_runs.legend(handles=[Line2D([], [], color=RUN_COLOURS[i % len(RUN_COLOURS)], lw=3,
                                   label=r.describe()) for i, r in enumerate(runs)],
                   loc="center", ncol=1 if len(runs) < 3 else 2, frameon=False, fontsize=10)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def log_if_wide(ax, values):
    """A log y axis, with plain numbers on it, when the values span more than a factor 20."""
    positive = [v for v in values if v > 0]
    if not positive or max(positive) / min(positive) <= 20:
        return False
    ax.set_yscale("log")
    decades = math.log10(max(positive) / min(positive))
    subs = (1, 2, 5) if decades < 2.5 else (1, 3) if decades < 4 else (1,)
    ax.yaxis.set_major_locator(LogLocator(subs=subs))
    ax.yaxis.set_minor_formatter(NullFormatter())
    eng = EngFormatter(sep="")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}" if v < 1000 else eng(v)))
    return True


def note(ax, text):
    """Says why a panel is empty, on a panel without axes."""
    ax.set_xticks([])
    ax.set_yticks([])
    if ax.get_legend():
        ax.get_legend().remove()
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")


# ------------------------------------------------------------------------------------ pipeline
def plot_pipeline(run, trace_path, out):
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {e["pid"]: (e.get("args") or {}).get("name", f"rank {e['pid']}") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and "pid" in e}
    spans = [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]
    if not spans:
        raise SystemExit(f"plot_run.py: {trace_path}: no complete (\"X\") events")
    args = lambda e: e.get("args") or {}  # noqa: E731
    steps = sorted({args(e).get("step", -1) for e in spans} - {-1})
    shown = steps[:MAX_TRACED_STEPS]
    if shown:  # the window: the first span of the first shown step to the end of the last one's
        inside = [e for e in spans if args(e).get("step", -1) in shown]
        t0 = min(e["ts"] for e in inside)
        t1 = max(e["ts"] + e["dur"] for e in inside)
    else:
        t0 = min(e["ts"] for e in spans)
        t1 = max(e["ts"] + e["dur"] for e in spans)
    spans = [e for e in spans if e["ts"] < t1 and e["ts"] + e["dur"] > t0]
    ranks = sorted({e["pid"] for e in spans} | set(names))
    row = {pid: i for i, pid in enumerate(ranks)}
    chunked = any(args(e).get("chunk", -1) > 0 for e in spans)
    ms = lambda t: (t - t0) / 1000.0  # noqa: E731
    width_ms = ms(t1)

    fig_w = 15
    fig, ax = plt.subplots(figsize=(fig_w, 1.6 + 0.75 * len(ranks)), constrained_layout=True)
    ax_px = fig_w * fig.dpi * 0.78  # about the axes' width in pixels, for label fitting
    used, busy = {}, {pid: 0.0 for pid in ranks}
    for e in sorted(spans, key=lambda e: e["ts"]):
        a = args(e)
        op = a.get("op", e.get("name", ""))
        label, colour = OPS.get(op, OTHER_OP)
        used[op] = (label, colour)
        x, w = ms(max(e["ts"], t0)), (min(e["ts"] + e["dur"], t1) - max(e["ts"], t0)) / 1000.0
        y = row[e["pid"]]
        is_compute = e.get("cat", "compute" if e.get("tid", 0) == 0 else "comm") == "compute"
        if is_compute:
            busy[e["pid"]] += w
            ax.broken_barh([(x, w)], (y - 0.36, 0.56), facecolors=colour, edgecolor="white",
                           linewidth=0.6)
            mb = a.get("micro_batch", -1)
            if mb is not None and mb >= 0:
                text = f"{mb}.{a.get('chunk', 0)}" if chunked else str(mb)
                if w / width_ms * ax_px >= 7 * len(text) + 4:
                    dark = sum(int(colour[i:i + 2], 16) for i in (1, 3, 5)) < 3 * 150
                    ax.text(x + w / 2, y - 0.08, text, ha="center", va="center", fontsize=8,
                            color="white" if dark else "black", clip_on=True)
        else:  # communication and input waits: a thin sub-row under the compute boxes
            ax.broken_barh([(x, w)], (y + 0.24, 0.14), facecolors=colour, edgecolor="none")

    for s in shown:
        start = min(e["ts"] for e in spans if args(e).get("step", -1) == s)
        ax.axvline(ms(start), color="0.3", ls=":", lw=1)
        ax.text(ms(start), 1.005, f"step {s}", fontsize=9, color="0.25", va="bottom", ha="center",
                transform=ax.get_xaxis_transform())
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"{names.get(pid, f'rank {pid}')}\ncompute {100 * busy[pid] / width_ms:.0f}%"
                        for pid in ranks], fontsize=9)
    ax.set_ylim(len(ranks) - 0.5, -0.55)
    ax.set_xlim(0, width_ms)
    ax.set_xlabel("time (ms) from the first span of the first traced step")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    order = list(OPS) + sorted(set(used) - set(OPS))
    handles = [Patch(facecolor=used[op][1], label=used[op][0]) for op in order if op in used]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.09 - 0.3 / len(ranks)),
              ncol=min(len(handles), 5), fontsize=9, frameon=False)
    p = run.config.get("parallel", {})
    tr = run.config.get("train", {})
    layout = ""
    if run.config:
        v = f", v {p['virtual_stages']}" if p.get("virtual_stages", 1) > 1 else ""
        layout = (f" (dp {p.get('dp', 1)} x pp {p.get('pp', 1)}, {p.get('schedule', '1f1b')}{v}, "
                  f"{tr.get('micro_batches', 1)} micro-batches)")
    shown_txt = (f"steps {shown[0]}-{shown[-1]}" if len(shown) > 1 else f"step {shown[0]}") \
        if shown else "all spans"
    more = f" of {len(steps)} traced" if len(steps) > len(shown) else ""
    ax.set_title(f"Pipeline of {run.name}{layout}: {shown_txt}{more}. Boxes: compute, "
                 "numbered by micro-batch; thin bars: waits and communication", fontsize=11, pad=16)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    doc = __doc__.split("\n\n")
    ap = argparse.ArgumentParser(description=doc[0], epilog=doc[-1].split("\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", metavar="DIR", help="where the PNGs go (default: the first RUN_DIR)")
    opts = ap.parse_args()
    out = opts.out or opts.run_dirs[0]
    os.makedirs(out, exist_ok=True)
    runs = [Run(p, n) for p, n in zip(opts.run_dirs, run_names(opts.run_dirs))]
    written = [os.path.join(out, "metrics.png")]
    plot_metrics(runs, written[0])
    for run in runs:
        trace = os.path.join(run.path, "trace.json")
        if os.path.isfile(trace):
            name = "pipeline.png" if len(runs) == 1 else f"pipeline-{run.name.replace('/', '_')}.png"
            written.append(os.path.join(out, name))
            plot_pipeline(run, trace, written[-1])
    for w in written:
        print(w)


if __name__ == "__main__":
    main()
