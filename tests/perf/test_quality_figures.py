"""Per-set summaries of SIM and MOS: right on known numbers, and a set that cannot be trusted
is refused with the figure named instead of passing as a score."""

from __future__ import annotations

import math

import pytest
from minicpm_speech_perf.quality_figures import (
    MOS,
    SIM,
    FigureSummary,
    InvalidFigureError,
    summarize_figure,
)


def test_mean_p10_and_count_on_known_numbers() -> None:
    values = {f"utt_{i}": i / 10 for i in range(1, 11)}  # 0.1 .. 1.0
    s = summarize_figure(SIM, values, model="resemblyzer-0.1.4")
    assert s.mean == pytest.approx(0.55)
    assert s.p10 == pytest.approx(0.19)  # linear interpolation: 0.1 + 0.9 * 0.1
    assert (s.count, s.missing) == (10, 0)
    assert s.to_json() == {
        "figure": "SIM", "mean": s.mean, "p10": s.p10, "count": 10, "missing": 0,
        "model": "resemblyzer-0.1.4",
    }  # fmt: skip


def test_missing_items_are_counted_not_averaged() -> None:
    s = summarize_figure(MOS, [3.0, None, 4.0, None, 2.0])
    assert (s.mean, s.count, s.missing) == (3.0, 3, 2)
    assert s.p10 == pytest.approx(2.2)


def test_one_value_and_a_few_zeros_are_fine() -> None:
    assert summarize_figure(MOS, [3.25]) == FigureSummary(MOS, 3.25, 3.25, 1, 0)
    s = summarize_figure(SIM, [0.0, 0.0, 0.5])
    assert s.mean == pytest.approx(1 / 6) and s.p10 == 0.0


@pytest.mark.parametrize(
    ("figure", "values", "reason"),
    [
        (SIM, [0.0, 0.0, 0.0], "SIM is 0.0 for every utterance (3): the speaker model did not run"),
        (SIM, {"a": 0.0, "b": None}, "SIM is 0.0 for every utterance (1)"),
        (MOS, [0.0] * 4, "MOS is 0.0 for every utterance (4): the MOS predictor did not run"),
        (SIM, [0.8, math.nan], "SIM is NaN or infinite for 1 of 2 utterances (first: item 1)"),
        (MOS, {"u1": math.inf}, "MOS is NaN or infinite for 1 of 1 utterances (first: u1)"),
        (SIM, [None, None], "SIM is missing for every utterance (2): the speaker model scored"),
        (MOS, [], "MOS has no utterances to summarise"),
        (SIM, {}, "SIM has no utterances to summarise"),
        (MOS, [3.1, 0.5], "MOS is outside [1, 5] for 1 utterances (first: item 1 = 0.5)"),
        (SIM, [0.9, 1.5], "SIM is outside [-1, 1] for 1 utterances"),
    ],
)
def test_untrustworthy_sets_are_refused_naming_the_figure(
    figure: str, values: list[float | None] | dict[str, float | None], reason: str
) -> None:
    with pytest.raises(InvalidFigureError) as err:
        summarize_figure(figure, values)
    assert err.value.figure == figure
    assert err.value.reason.startswith(reason), err.value.reason
    assert str(err.value) == err.value.reason


def test_other_figures_take_a_range_or_none() -> None:
    assert summarize_figure("PESQ", [4.4, -0.3]).count == 2
    with pytest.raises(InvalidFigureError, match=r"^PESQ is outside \[-0.5, 4.5\]"):
        summarize_figure("PESQ", [4.6], value_range=(-0.5, 4.5))
    with pytest.raises(InvalidFigureError, match=r"^PESQ is 0\.0 for every .*: the model did"):
        summarize_figure("PESQ", [0.0])
