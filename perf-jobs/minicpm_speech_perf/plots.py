"""PNG plots of a sweep: one line per arm against concurrency (log2 axis), min-max shaded.

`plots.json` beside the PNGs holds exactly the series that were drawn, read back from the
figure's own line objects, so what the picture shows can be checked without looking at it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # Job pods and CI have no display
import matplotlib.pyplot as plt

if TYPE_CHECKING:
    from .summarize import Point

Series = dict[str, dict[str, list[float | None]]]

PLOTS: tuple[tuple[str, str, str, str, str, str], ...] = (
    # file, title, y label, mean attr, low attr, high attr
    (
        "throughput.png",
        "Audio throughput",
        "audio-seconds per second",
        "audio_tput",
        "audio_tput_min",
        "audio_tput_max",
    ),
    (
        "first_audio_latency.png",
        "Mean time to first audio",
        "milliseconds",
        "ttfp_ms",
        "ttfp_ms_min",
        "ttfp_ms_max",
    ),
)


def series(points: Sequence[Point], mean: str, low: str, high: str) -> Series:
    """Per arm: concurrencies and the mean / min / max values to draw."""
    out: Series = {}
    for p in points:
        s = out.setdefault(p.arm, {"x": [], "y": [], "lo": [], "hi": []})
        s["x"].append(float(p.concurrency))
        s["y"].append(getattr(p, mean))
        s["lo"].append(getattr(p, low))
        s["hi"].append(getattr(p, high))
    return out


def render(data: Series, path: Path, *, title: str, ylabel: str) -> list[dict[str, Any]]:
    """Draw and save; return each arm's line as the figure holds it (label, x, y)."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    try:
        for arm, s in data.items():
            pairs = [(x, y) for x, y in zip(s["x"], s["y"], strict=True) if x and y is not None]
            xs = [float(x) for x, _ in pairs if x is not None]
            ys = [float(y) for _, y in pairs if y is not None]
            (line,) = ax.plot(xs, ys, marker="o", label=arm)
            band = [
                (x, lo, hi)
                for x, lo, hi in zip(s["x"], s["lo"], s["hi"], strict=True)
                if lo is not None and hi is not None
            ]
            if band:
                bx, blo, bhi = zip(*band, strict=True)
                ax.fill_between(bx, blo, bhi, alpha=0.2, color=line.get_color(), linewidth=0)
        ax.set_xscale("log", base=2)
        ticks = sorted({x for s in data.values() for x in s["x"] if x is not None})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlabel("max concurrency")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(title="arm")
        fig.tight_layout()
        fig.savefig(path, format="png")
        return [
            {
                "label": str(line.get_label()),
                "x": np.asarray(line.get_xdata(), dtype=float).tolist(),
                "y": np.asarray(line.get_ydata(), dtype=float).tolist(),
            }
            for line in ax.get_lines()
        ]
    finally:
        plt.close(fig)


def write_plots(points: Sequence[Point], out_dir: Path) -> dict[str, Any]:
    """Both plots plus `plots.json` with the drawn series."""
    drawn: dict[str, Any] = {}
    for name, title, ylabel, mean, low, high in PLOTS:
        data = series(points, mean, low, high)
        drawn[name] = {
            "title": title,
            "lines": render(data, out_dir / name, title=title, ylabel=ylabel),
            "bands": {arm: {"lo": s["lo"], "hi": s["hi"]} for arm, s in data.items()},
        }
    (out_dir / "plots.json").write_text(json.dumps(drawn, indent=2) + "\n", encoding="utf-8")
    return drawn
