"""Draw the site's figures into ``docs/images/`` as SVG.

The architecture and the round's timeline are diagrams; the training curves, one iteration's
timeline and the progress bar are drawn from a real fit recorded by ``record_fit.py``
(``fit_record.json`` beside this file). Needs matplotlib; run from the repository root::

    python docs/_figures/make_figures.py
"""

from __future__ import annotations

import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = os.path.join(os.path.dirname(HERE), "images")
plt.rcParams.update({"svg.fonttype": "none", "font.family": "DejaVu Sans", "font.size": 10,
                     "svg.hashsalt": "sparkdl"})

DRIVER, EXECUTOR, SHUFFLE, BROADCAST = "#e8eaf6", "#e0f2f1", "#fff3e0", "#3949ab"


def save(fig, name: str) -> None:
    fig.savefig(os.path.join(IMAGES, name), format="svg", bbox_inches="tight",
                metadata={"Date": None, "Creator": None})
    plt.close(fig)


def box(ax, x, y, w, h, text, color, size=9, weight="normal"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor="#455a64", linewidth=1))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
            weight=weight, wrap=True)


def arrow(ax, start, end, color="#455a64", text=None, offset=(0, 0.12), style="-|>", ls="-"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color,
                                 linewidth=1.3, linestyle=ls, shrinkA=2, shrinkB=2))
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text,
                ha="center", va="bottom", fontsize=8, color=color)


def architecture() -> None:
    """Driver, executors with their cached shards and Python workers, shuffle blocks, reducers,
    the collected sums and the next broadcast."""
    fig, ax = plt.subplots(figsize=(11, 5.8))
    ax.set_xlim(0, 11)
    ax.set_ylim(0.2, 5.9)
    ax.axis("off")
    # the driver
    ax.add_patch(FancyBboxPatch((0.1, 0.35), 2.4, 5.0, boxstyle="round,pad=0.02",
                                facecolor=DRIVER, edgecolor="#3949ab", linewidth=1.5))
    ax.text(1.3, 5.1, "driver", ha="center", weight="bold", fontsize=11)
    box(ax, 0.3, 3.8, 2.0, 0.95, "weights $w_t$\nthe batch plan", "white")
    box(ax, 0.3, 2.2, 2.0, 0.95, "optimizer.step()\nscheduler.step()", "white")
    box(ax, 0.3, 0.55, 2.0, 1.0, "summed gradient $g_t$\ninto p.grad", "white")
    arrow(ax, (1.3, 1.55), (1.3, 2.2))
    arrow(ax, (1.3, 3.15), (1.3, 3.8), text="$w_{t+1}$", offset=(0.35, -0.1))
    # executors
    for row, (y, i) in enumerate(((3.35, 1), (1.05, 2))):
        ax.add_patch(FancyBboxPatch((3.3, y), 3.7, 2.0, boxstyle="round,pad=0.02",
                                    facecolor=EXECUTOR, edgecolor="#00796b", linewidth=1.5))
        ax.text(5.15, y + 1.75, f"executor {i}", ha="center", weight="bold", fontsize=10)
        box(ax, 3.45, y + 0.15, 1.45, 1.35, f"shard {i - 1}\ncached\n(memory-mapped)", "white", 8)
        box(ax, 5.1, y + 0.15, 1.75, 1.35,
            f"task {i - 1} in the\nPython worker:\nreplica, batch $B_{i - 1}(t)$\n"
            f"$g_{i - 1}$ cut into K blocks", "white", 8)
        arrow(ax, (4.9, y + 0.82), (5.1, y + 0.82))
        arrow(ax, (2.5, 4.3), (3.3, y + 1.2), color=BROADCAST)
    ax.text(2.9, 5.45, "sc.broadcast($w_t$)", ha="center", fontsize=8.5, color=BROADCAST)
    arrow(ax, (2.9, 5.4), (2.9, 4.35), color=BROADCAST, style="-")
    # shuffle and reducers
    ax.add_patch(FancyBboxPatch((7.6, 1.05), 3.2, 4.3, boxstyle="round,pad=0.02",
                                facecolor=SHUFFLE, edgecolor="#ef6c00", linewidth=1.5))
    ax.text(9.2, 5.0, "shuffle: block k of every task\nto reduce partition k", ha="center",
            va="center", weight="bold", fontsize=9)
    for k, y in enumerate((3.65, 2.45, 1.25)):
        box(ax, 8.5, y, 2.1, 0.8, f"reducer {k}: $\\sum_i$ block {k}\nin partition order",
            "white", 8)
        for task_y in (4.15, 1.85):
            arrow(ax, (6.85, task_y), (8.5, y + 0.4), color="#ef6c00")
    ax.text(7.3, 5.45, "K blocks per task", fontsize=8.5, color="#ef6c00", ha="center")
    # the sums come back, under the executors
    ax.plot([9.55, 9.55], [1.25, 0.75], color="#00796b", linewidth=1.3, linestyle="--")
    arrow(ax, (9.55, 0.75), (2.3, 0.75), color="#00796b", ls="--")
    ax.text(6.0, 0.42, "collect: the K sums reach the driver", ha="center", fontsize=8.5,
            color="#00796b")
    save(fig, "architecture.svg")


def _median_ms(iterations, key):
    return 1000 * statistics.median(r[key] for r in iterations[5:])


def iteration_timeline(record) -> None:
    """One iteration, what runs where and when, with the fit's median spans."""
    its = record["iterations"]
    spans = [("broadcast", "broadcast_s", "driver", BROADCAST),
             ("launch", "launch_s", "tasks", "#90a4ae"),
             ("compute", "compute_s", "tasks", "#00897b"),
             ("exchange", "exchange_s", "shuffle", "#fb8c00"),
             ("reduce", "reduce_s", "reducers", "#f4511e"),
             ("collect", "collect_s", "reducers", "#6d4c41"),
             ("update", "update_s", "driver", "#5e35b1")]
    rows = ["driver", "tasks", "shuffle", "reducers"]
    medians = [(name, _median_ms(its, key), row, color) for name, key, row, color in spans]
    fig, ax = plt.subplots(figsize=(10, 3.0))
    start, below = 0.0, False
    wall = _median_ms(its, "wall_s")
    for name, ms, row, color in medians + [("other", None, "driver", "#cfd8dc")]:
        # the spans follow each other; what is left of the wall time is Spark's own
        width = max(0.0, wall - start) if name == "other" else ms
        y = rows.index(row)
        ax.barh(y, max(width, 0.15), left=start, color=color, edgecolor="white", height=0.5)
        # narrow spans alternate their labels above and below the bar
        below = width < 0.06 * wall and not below and start > 0
        ax.text(start + width / 2 if start > 0 else 0, y + 0.3 if below else y - 0.3,
                f"{name} {width:.1f} ms", ha="center" if start > 0 else "left", va="top" if below else "bottom", fontsize=7.5)
        start += width
    ax.axvline(wall, color="#455a64", linestyle=":", linewidth=1)
    ax.text(wall, len(rows) - 0.5, f"wall {wall:.0f} ms ", ha="right", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.1, -0.8)
    ax.set_xlabel("milliseconds into the iteration (median over the fit's iterations)")
    setup = record["setup"]
    ax.set_title(f"One iteration = one Spark job: {setup['model']}, batch {setup['batch_size']}, "
                 f"{setup['partitions']} partitions on {setup['master']}", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    save(fig, "iteration-timeline.svg")


def round_timeline() -> None:
    """A local round of H = 4: one job, H local steps on every partition, one exchange."""
    fig, ax = plt.subplots(figsize=(10, 2.8))
    h = 4
    rows = ["driver", "partition 0", "partition 1"]
    ax.barh(0, 0.8, left=0, color=BROADCAST, height=0.6)
    ax.text(0.9, 0, "broadcast $w_r$ and each partition's optimizer state", ha="left",
            va="center", fontsize=8)
    for p in (1, 2):
        ax.barh(p, 0.4, left=0.8, color="#90a4ae", height=0.6)
        for step in range(h):
            ax.barh(p, 0.9, left=1.2 + step * 1.0, color="#00897b", height=0.6,
                    edgecolor="white")
            ax.text(1.65 + step * 1.0, p, f"step {step + 1}", ha="center", va="center",
                    fontsize=7.5, color="white")
    ax.text(3.2, 1.5, f"H = {h} steps of each partition's own optimizer",
            ha="center", va="center", fontsize=8)
    ax.barh(1.5, 1.3, left=5.2, color="#fb8c00", height=1.4)
    ax.text(5.85, 1.5, "AllReduce of\nthe deltas\n$w_r - w_i$", ha="center", va="center",
            fontsize=7.5)
    ax.barh(0, 0.9, left=6.5, color="#5e35b1", height=0.6)
    ax.text(6.95, 0, "outer step\n$w_{r+1}$", ha="center", va="center", fontsize=7.5,
            color="white")
    ax.barh(0, 0.8, left=7.4, color=BROADCAST, height=0.6, alpha=0.45)
    ax.text(7.8, 0, "next\nround", ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(2.5, -0.5)
    ax.set_xticks([])
    ax.set_xlabel("time (one Spark job for the whole round)")
    ax.set_title("One local round (local_steps=4): one job, one exchange, H steps", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    save(fig, "round-timeline.svg")


def training_curves(record) -> None:
    its, vals = record["iterations"], record["validations"]
    per_epoch = len(its) / record["setup"]["epochs"]
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    loss_ax.plot([r["iteration"] / per_epoch for r in its], [r["loss"] for r in its],
                 alpha=0.5, label="train, per iteration")
    loss_ax.plot([v["epoch"] for v in vals], [v["metrics"]["Loss"] for v in vals], "o-",
                 label="test, after each epoch")
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("cross-entropy")
    loss_ax.legend()
    acc_ax.plot([v["epoch"] for v in vals], [v["metrics"]["Top1Accuracy"] for v in vals], "o-",
                color="C2")
    acc_ax.set_xlabel("epoch")
    acc_ax.set_ylabel("test accuracy (Top1Accuracy)")
    acc_ax.set_xticks([v["epoch"] for v in vals])
    setup = record["setup"]
    fig.suptitle(f"{setup['model']} on {setup['data']}: opt.summary of one fit", fontsize=10)
    fig.tight_layout()
    save(fig, "training-curves.svg")


def progress_bar(record) -> None:
    """The terminal after the fit: one line per epoch."""
    lines = record["progress_bar"]
    width = max(len(line) for line in lines)
    fig = plt.figure(figsize=(0.075 * width + 0.4, 0.26 * len(lines) + 0.35))
    fig.patch.set_facecolor("#263238")
    for i, line in enumerate(lines):
        fig.text(0.02, 1 - (i + 1) / (len(lines) + 0.6), line, family="DejaVu Sans Mono",
                 fontsize=9, color="#eceff1", va="center")
    save(fig, "progress-bar.svg")


def main() -> None:
    os.makedirs(IMAGES, exist_ok=True)
    architecture()
    round_timeline()
    with open(os.path.join(HERE, "fit_record.json")) as f:
        record = json.load(f)
    iteration_timeline(record)
    training_curves(record)
    progress_bar(record)


if __name__ == "__main__":
    main()
