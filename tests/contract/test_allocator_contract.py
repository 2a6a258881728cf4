"""The allocator settings every engine process gets, and a pod's own choice kept."""

from __future__ import annotations

import pytest
from minicpm_speech_contract.allocator import (
    ALLOC_CONF,
    ALLOC_CONF_ENV,
    ALLOC_CONF_ENV_NEW,
    with_allocator_conf,
)


def test_an_environment_without_settings_gets_expandable_segments() -> None:
    env = with_allocator_conf({"PATH": "/usr/bin"})
    # both names: newer PyTorch warns at every start when it finds only the older one
    assert env == {"PATH": "/usr/bin", ALLOC_CONF_ENV: "expandable_segments:True",
                   ALLOC_CONF_ENV_NEW: "expandable_segments:True"}
    assert ALLOC_CONF == "expandable_segments:True"


@pytest.mark.parametrize("name", [ALLOC_CONF_ENV, ALLOC_CONF_ENV_NEW])
def test_settings_the_pod_already_chose_are_kept(name: str) -> None:
    mine = {name: "max_split_size_mb:512"}
    assert with_allocator_conf(mine) == mine


def test_the_callers_environment_is_not_changed() -> None:
    environ = {"HOME": "/root"}
    with_allocator_conf(environ)
    assert environ == {"HOME": "/root"}
