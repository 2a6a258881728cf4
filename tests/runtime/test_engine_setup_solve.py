"""The packed setup's layout: where each prompt sits, what each frame attends to and reads, and
which frames become each prompt's conv cache. (Its numbers against the reference:
``test_engine_parity.py::test_cold_setup_caches_equal_reference_setup_cache``.)"""

from __future__ import annotations

import pytest
from minicpm_speech_runtime.engine.setup_solve import PackLayout, packed_indices


def test_prompts_sit_end_to_end_and_the_padding_is_a_segment_of_its_own() -> None:
    layout = PackLayout((4, 6, 2), 16)
    assert layout.used == 12 and layout.starts == [0, 4, 10]
    assert layout.segments() == [(0, 4), (4, 10), (10, 12), (12, 16)]
    assert PackLayout((4, 6), 10).segments() == [(0, 4), (4, 10)]


def test_each_frame_attends_and_convolves_within_its_own_prompt() -> None:
    ix = packed_indices(PackLayout((4, 6, 2), 16), conv_rows=8)
    ranges = ix["key_range"][0].tolist()
    assert ranges[3] == [0, 4] and ranges[4] == [4, 10] and ranges[11] == [10, 12]
    assert ranges[15] == [12, 16]  # padding attends to padding only: finite, read by no one
    assert (ix["key_range"][0] == ix["key_range"][1]).all()  # both CFG rows alike
    assert ix["seg_first"][0].tolist() == [0] * 4 + [4] * 6 + [10] * 2 + [12] * 4
    assert ix["write_pos"][1].tolist() == list(range(16))
    # every prompt's noise starts at the noise's first frame, as the reference's setup
    assert ix["noise"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1, 0, 1, 2, 3]
    assert ix["segment"].tolist() == [0] * 4 + [1] * 6 + [2] * 2 + [3] * 4


def test_conv_rows_take_the_last_two_frames_of_their_prompt_and_cfg_row() -> None:
    ix = packed_indices(PackLayout((4, 6), 12), conv_rows=6)
    # row r = 2 * prompt + cfg row; a flat index is cfg row * width + frame
    assert ix["cache_src"].tolist()[:4] == [[2, 3], [14, 15], [8, 9], [20, 21]]


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 frames"):
        PackLayout((4, 1), 8)
    with pytest.raises(ValueError, match="at least 2 frames"):
        PackLayout((), 8)
    with pytest.raises(ValueError, match="do not fit"):
        PackLayout((4, 6), 8)
