"""A Thinker reply that leaves the Talker no condition is read as an empty one (the Talker then
ends that request without audio), and only then."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from minicpm_speech_runtime.serving.talker_handoff import (
    HANDOFF,
    MARKER,
    empty_when_missing,
    patch_talker,
)

EMPTY = ("no ids", "no hidden states")


def reader(found: tuple[Any, Any]) -> Any:
    return lambda info: found


def test_a_missing_condition_becomes_the_empty_one() -> None:
    read = empty_when_missing(reader((None, None)), lambda: EMPTY)
    assert read({"request_id": "r"}) == EMPTY


def test_a_condition_that_is_there_or_half_there_or_duplex_is_left_alone() -> None:
    assert empty_when_missing(reader(("ids", "h")), lambda: EMPTY)({}) == ("ids", "h")
    assert empty_when_missing(reader(("ids", None)), lambda: EMPTY)({}) == ("ids", None)
    duplex = empty_when_missing(reader((None, None)), lambda: EMPTY)
    assert duplex({"native_duplex": True}) == (None, None)


def test_the_talker_module_is_patched_once_with_empty_tensors() -> None:
    import torch

    module = SimpleNamespace(**{HANDOFF: reader((None, None))})
    assert patch_talker(module) is True
    wrapped = getattr(module, HANDOFF)
    assert patch_talker(module) is False and getattr(module, HANDOFF) is wrapped
    assert getattr(module, MARKER)
    ids, hidden = wrapped({})
    assert isinstance(ids, torch.Tensor) and ids.numel() == 0 and ids.dtype == torch.long
    assert isinstance(hidden, torch.Tensor) and hidden.numel() == 0
