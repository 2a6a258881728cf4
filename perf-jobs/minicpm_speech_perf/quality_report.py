"""What a quality run measured, for people: `quality.md`, a table per concurrency, and
`quality.png`, the per-utterance SIM and MOS at each concurrency (a low tail is what a mean
hides). `quality_plot.json` holds exactly the values drawn, so the picture can be checked
without looking at it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PLOT_FILE = "quality.png"
PLOT_DATA_FILE = "quality_plot.json"
# (row key, panel title, y label)
PANELS = (("sim", "Speaker similarity to the reference voice", "cosine"),
          ("mos", "Predicted naturalness", "MOS (1-5)"))


def quality_markdown(doc: Mapping[str, Any]) -> str:
    rows: Sequence[Mapping[str, Any]] = doc.get("rows") or []
    sim_model, mos_model = doc.get("sim_model") or "no model", doc.get("mos_model") or "no model"
    lines = [
        f"# Quality of {doc.get('config_hash')} ({doc.get('mode')})",
        "",
        f"Status: {doc.get('status')}{': ' + str(doc['reason']) if doc.get('reason') else ''}. "
        f"SIM by {sim_model}, MOS by {mos_model}.",
        "",
        "| C | WER % | re-scored WER % | SIM mean | SIM p10 | MOS mean | MOS p10 | judged/total |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['concurrency']} | {_percent(row.get('wer'))} | "
            f"{_percent(row.get('rescored'))} | {_number(row.get('sim'), '.3f')} | "
            f"{_number(row.get('sim_p10'), '.3f')} | {_number(row.get('mos'), '.2f')} | "
            f"{_number(row.get('mos_p10'), '.2f')} | {row.get('judged')}/{row.get('total')} |")
    notes = [f"- C{row['concurrency']}: {row[key]}" for row in rows
             for key in ("sim_error", "mos_error") if row.get(key)]
    if notes:
        lines += ["", "Figures not measured:", "", *notes]
    return "\n".join(lines) + "\n"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.2f}"


def _number(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def plotted_values(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per figure and concurrency, the utterances' values that were scored."""
    return {key: {str(row["concurrency"]): [float(v) for v in (row.get(f"{key}_items") or {})
                                            .values() if v is not None] for row in rows}
            for key, _, _ in PANELS}


def write_quality_plot(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")  # Job pods and CI have no display
    import matplotlib.pyplot as plt

    values = plotted_values(rows)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(10, 4), dpi=100)
    drawn: dict[str, Any] = {}
    try:
        for ax, (key, title, ylabel) in zip(axes, PANELS, strict=True):
            labels = [c for c, v in values[key].items() if v]
            data = [values[key][c] for c in labels]
            if data:
                ax.boxplot(data, whis=(10, 90))
                ax.set_xticks(range(1, len(labels) + 1), [f"C{c}" for c in labels])
            ax.set_title(title)
            ax.set_ylabel(ylabel)
            ax.grid(True, axis="y", alpha=0.3)
            drawn[key] = {"title": title, "series": dict(zip(labels, data, strict=True))}
        fig.tight_layout()
        fig.savefig(out_dir / PLOT_FILE, format="png")
    finally:
        plt.close(fig)
    (out_dir / PLOT_DATA_FILE).write_text(json.dumps(drawn, indent=2) + "\n", encoding="utf-8")
    return drawn
