"""PNG plots of a harness run: accuracy vs time (paper Figure 11), per-epoch time bars
(Figure 13), tuple visiting order (Figures 3/4)."""

import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"no_shuffle": "tab:red", "no_shuffle_single": "salmon", "block_only": "tab:orange", "corgipile": "tab:green",
          "corgipile_single": "tab:olive", "corgipile_buf2": "tab:cyan", "sliding_window": "tab:purple",
          "mrs": "tab:brown", "shuffle_once": "tab:blue", "shuffle_once_pile": "tab:pink", "sklearn": "tab:gray"}


def _ok(runs):
    return {n: r for n, r in runs.items() if "skipped" not in r}


def accuracy_vs_time(results, path):
    panels = [(d, m) for d in results["datasets"] for m in d["models"]]
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (d, model) in zip(axes.flat, panels):
        for name, r in _ok(d["models"][model]["runs"]).items():
            # End to end: the copy or export, then the statement's time outside its epochs
            # (statistics pass, planning, storing), then the epochs.
            t = r["offset"] + r.get("overhead", 0.0)
            xs, ys = [t], [None]
            for s, a in zip(r["epoch_seconds"], r["val_acc"]):
                t += s
                xs.append(t)
                ys.append(a)
            ax.plot(xs[1:], ys[1:], marker="o", ms=3, label=name, color=COLORS.get(name))
            if r["offset"]:
                ax.axvline(r["offset"], color=COLORS.get(name), ls=":", lw=0.8)
        target = d["models"][model]["best_val_acc"] - 0.005
        ax.axhline(target, color="k", ls="--", lw=0.6)
        ax.set_title(f"{d['dataset']}\n{model}", fontsize=9)
        ax.set_xlabel("end-to-end seconds (copy/export + epochs)", fontsize=8)
        ax.set_ylabel("validation accuracy", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def epoch_bars(results, path):
    panels = [(d, m) for d in results["datasets"] if d["order"] == "clustered" for m in d["models"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.8), squeeze=False)
    for ax, (d, model) in zip(axes.flat, panels):
        runs = {n: r for n, r in _ok(d["models"][model]["runs"]).items() if n != "sklearn"}
        names = list(runs)
        meds = [statistics.median(r["epoch_seconds"]) for r in runs.values()]
        lo = [m - min(r["epoch_seconds"]) for m, r in zip(meds, runs.values())]
        hi = [max(r["epoch_seconds"]) - m for m, r in zip(meds, runs.values())]
        ax.bar(range(len(names)), meds, yerr=[lo, hi], color=[COLORS.get(n) for n in names], capsize=2)
        ax.axhline(statistics.median(d["floor"]["seconds"]), color="k", ls="--", lw=0.8, label="scan floor")
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{d['dataset']}\n{model}", fontsize=8)
        ax.set_ylabel("seconds per epoch (median, range)", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def tuple_order(trace, path, window=50):
    names = [n for n, v in trace.items() if isinstance(v, list)]
    fig, axes = plt.subplots(2, len(names), figsize=(3 * len(names), 6), squeeze=False)
    for i, name in enumerate(names):
        rows = trace[name]
        original = [r[2] for r in rows]  # features[1] = original row number
        labels = [r[1] for r in rows]
        ax = axes[0][i]
        ax.scatter(range(1, len(rows) + 1), original, s=1, c=labels, cmap="coolwarm")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("position seen by SGD (epoch 1)", fontsize=7)
        ax.set_ylabel("original row number", fontsize=7)
        ax = axes[1][i]
        wins = [labels[j:j + window] for j in range(0, len(labels), window)]
        pos = [sum(1 for v in w if v == max(labels)) for w in wins]
        ax.bar(range(len(wins)), [len(w) - p for w, p in zip(wins, pos)], color="tab:blue", label="negative")
        ax.bar(range(len(wins)), pos, bottom=[len(w) - p for w, p in zip(wins, pos)], color="tab:red", label="positive")
        ax.set_xlabel(f"window of {window} tuples", fontsize=7)
        ax.set_ylabel("labels per window", fontsize=7)
        if i == 0:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def sensitivity_plot(results, path):
    ds = [d for d in results["datasets"] if "sensitivity" in d]
    if not ds:
        return False
    d = ds[0]
    runs = d["sensitivity"]["runs"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, r in runs:
        if label.startswith("buffer"):
            t, xs = r.get("overhead", 0.0), []
            for s in r["epoch_seconds"]:
                t += s
                xs.append(t)
            a1.plot(xs, r["val_acc"], marker="o", ms=3, label=label)
    so = d["models"][d["sensitivity"]["model"]]["runs"].get("shuffle_once")
    if so and "skipped" not in so:
        t, xs = so["offset"] + so.get("overhead", 0.0), []
        for s in so["epoch_seconds"]:
            t += s
            xs.append(t)
        a1.plot(xs, so["val_acc"], marker="s", ms=3, label="shuffle_once", color="tab:blue", ls="--")
    a1.set_title(f"{d['dataset']}: buffer size (Fig. 14a)", fontsize=9)
    a1.set_xlabel("end-to-end seconds")
    a1.set_ylabel("validation accuracy")
    a1.legend(fontsize=7)
    blocks = [(label, r) for label, r in runs if label.startswith("block")]
    a2.bar([b[0] for b in blocks], [statistics.median(r["epoch_seconds"]) for _, r in blocks])
    a2.set_title("block size: seconds per epoch (Fig. 14b)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def all_plots(results, prefix):
    out = [f"{prefix}_accuracy_vs_time.png", f"{prefix}_epoch_times.png"]
    accuracy_vs_time(results, out[0])
    epoch_bars(results, out[1])
    if "missing" not in results["trace"] and any(isinstance(v, list) for v in results["trace"].values()):
        out.append(f"{prefix}_tuple_order.png")
        tuple_order(results["trace"], out[-1])
    if sensitivity_plot(results, f"{prefix}_sensitivity.png"):
        out.append(f"{prefix}_sensitivity.png")
    return out
