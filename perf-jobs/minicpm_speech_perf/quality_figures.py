"""Per-set summaries of per-utterance quality figures (SIM, MOS): mean, p10 and count.

A gate compares these numbers with thresholds, so a set whose numbers cannot be trusted is
refused here with a reason that names the figure, never summarised: no values at all, a value
that is NaN or infinite, a value outside the figure's range, or exactly 0.0 for every
utterance (what a model that never ran leaves behind).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SIM = "SIM"
MOS = "MOS"

# What produced each figure, for the reasons given when a set is refused.
_PRODUCERS = {SIM: "speaker model", MOS: "MOS predictor"}
# The values each figure can take; anything else is a broken model or a mixed-up column.
RANGES: dict[str, tuple[float, float]] = {SIM: (-1.0, 1.0), MOS: (1.0, 5.0)}

Values = Mapping[str, float | None] | Sequence[float | None]


class InvalidFigureError(ValueError):
    """A set whose figure cannot be reported; `reason` names the figure and the cause."""

    def __init__(self, figure: str, reason: str) -> None:
        super().__init__(reason)
        self.figure = figure
        self.reason = reason


@dataclass(frozen=True, slots=True)
class FigureSummary:
    figure: str
    mean: float
    p10: float
    count: int  # utterances with a value
    missing: int  # utterances without one (their WAV could not be scored)
    model: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "mean": self.mean,
            "p10": self.p10,
            "count": self.count,
            "missing": self.missing,
            "model": self.model,
        }


def summarize_figure(
    figure: str,
    values: Values,
    *,
    model: str | None = None,
    value_range: tuple[float, float] | None = None,
) -> FigureSummary:
    """Mean, 10th percentile (linear interpolation) and count of the values that are present.

    `values` maps utterance ids to a value, or None where the utterance could not be scored
    (a plain sequence is keyed by position). `value_range` defaults to the figure's entry in
    RANGES. Raises InvalidFigureError instead of summarising a set that cannot be trusted.
    """
    items = _keyed(values)
    producer = _PRODUCERS.get(figure, "model")
    if not items:
        raise InvalidFigureError(figure, f"{figure} has no utterances to summarise")
    present = {k: v for k, v in items.items() if v is not None}
    if not present:
        raise InvalidFigureError(
            figure,
            f"{figure} is missing for every utterance ({len(items)}): "
            f"the {producer} scored none of them",
        )
    not_finite = [k for k, v in present.items() if not math.isfinite(v)]
    if not_finite:
        raise InvalidFigureError(
            figure,
            f"{figure} is NaN or infinite for {len(not_finite)} of {len(present)} utterances "
            f"(first: {not_finite[0]}): the {producer} failed",
        )
    if all(v == 0.0 for v in present.values()):
        raise InvalidFigureError(
            figure,
            f"{figure} is 0.0 for every utterance ({len(present)}): the {producer} did not run",
        )
    low, high = value_range or RANGES.get(figure, (-math.inf, math.inf))
    outside = [k for k, v in present.items() if not low <= v <= high]
    if outside:
        raise InvalidFigureError(
            figure,
            f"{figure} is outside [{low:g}, {high:g}] for {len(outside)} utterances "
            f"(first: {outside[0]} = {present[outside[0]]!r}): not a {figure} value",
        )
    array = np.array(list(present.values()), dtype=np.float64)
    return FigureSummary(
        figure=figure,
        mean=float(array.mean()),
        p10=float(np.percentile(array, 10)),
        count=len(present),
        missing=len(items) - len(present),
        model=model,
    )


def _keyed(values: Values) -> dict[str, float | None]:
    if isinstance(values, Mapping):
        return {str(k): _number(v) for k, v in values.items()}
    return {f"item {i}": _number(v) for i, v in enumerate(values)}


def _number(v: float | None) -> float | None:
    return None if v is None else float(v)
