"""Snapshot of the default rendering: any change to what `helm install` creates or
prints shows up as a diff in review. Regenerate after an intended change with

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/chart/test_golden.py
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.chart.rendering import NOTES, render

GOLDEN_DIR = Path(__file__).parent / "golden"


def manifests() -> str:
    """The objects, like `helm template` prints them."""
    rendered = render()
    parts = []
    for path in sorted(rendered):
        body = rendered[path].strip("\n")
        if not path.endswith(NOTES) and body.strip():
            parts.append(f"# Source: {path}\n{body}\n")
    return "---\n".join(parts)


def notes() -> str:
    return render()[f"templates/{NOTES}"].strip("\n") + "\n"


@pytest.mark.parametrize(
    ("name", "produce"), [("default.yaml", manifests), ("default-NOTES.txt", notes)]
)
def test_default_rendering_matches_the_snapshot(name: str, produce: Callable[[], str]) -> None:
    actual = produce()
    golden = GOLDEN_DIR / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN_DIR.mkdir(exist_ok=True)
        golden.write_text(actual)
    assert golden.exists(), f"no snapshot {name} yet: run with UPDATE_GOLDEN=1"
    assert actual == golden.read_text(), (
        f"the default rendering changed ({name}); if intended, regenerate with UPDATE_GOLDEN=1"
    )


def test_the_snapshot_is_valid_yaml() -> None:
    docs = [d for d in yaml.safe_load_all((GOLDEN_DIR / "default.yaml").read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert kinds >= {"Deployment", "ServiceAccount", "Role", "RoleBinding"}
    assert "ClusterRole" not in kinds  # namespaced by default: nothing cluster-wide
