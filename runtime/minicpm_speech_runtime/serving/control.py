"""The file protocol between the supervisor and the server's stage-2 process.

The supervisor owns a run directory (``$MINICPM_SPEECH_RUN_DIR``, else
``<tempdir>/minicpm-speech``; ``/tmp`` is an emptyDir in the pod) and empties it at start:

* ``metrics/`` is ``PROMETHEUS_MULTIPROC_DIR`` of every server process (see :mod:`.metrics`);
* ``control/`` is ``MINICPM_SPEECH_CONTROL_DIR``, where the supervisor writes
  ``draining.json`` when a drain begins (``{"since": ..., "deadline_seconds": ...}``; while it
  exists the API server refuses new streams, :mod:`.drain`), and the plugin writes two JSON
  files:

  - ``plugin.json`` when the batched runtime is wired into stage 2
    (``{"pid": ..., "options": {...}}``);
  - ``precapture.json`` when the reference-driven graph precapture has ended
    (``{"state": "done" | "failed" | "skipped", "reason": ..., "seconds": ...,
    "graphs": ...}``).

Each is written atomically (temporary file + rename), so a reader sees a whole document or
none, and the supervisor removes them once the server has exited. The supervisor also exports
``MINICPM_SPEECH_DEPLOY_CONFIG`` (the ``--deploy-config`` of the server command), which the
plugin reads to decide, in every process, whether it is on.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

RUN_DIR_ENV = "MINICPM_SPEECH_RUN_DIR"
CONTROL_DIR_ENV = "MINICPM_SPEECH_CONTROL_DIR"
DEPLOY_CONFIG_ENV = "MINICPM_SPEECH_DEPLOY_CONFIG"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

PLUGIN_FILE = "plugin.json"
PRECAPTURE_FILE = "precapture.json"
DRAIN_FILE = "draining.json"


def default_run_dir() -> Path:
    return Path(os.environ.get(RUN_DIR_ENV) or Path(tempfile.gettempdir()) / "minicpm-speech")


def prepare_run_dir(run_dir: Path) -> tuple[Path, Path]:
    """Empty and create ``control/`` and ``metrics/`` under ``run_dir``; returns both."""
    control, metrics = run_dir / "control", run_dir / "metrics"
    for path in (control, metrics):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    return control, metrics


def write_json(directory: Path, name: str, document: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, sort_keys=True)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def withdraw(directory: Path) -> None:
    """Remove what described the server, once it is gone."""
    for name in (PLUGIN_FILE, PRECAPTURE_FILE, DRAIN_FILE):
        (directory / name).unlink(missing_ok=True)


def read_json(directory: Path, name: str) -> dict[str, Any] | None:
    try:
        document = json.loads((directory / name).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return document if isinstance(document, dict) else None


def control_dir_from_env() -> Path | None:
    value = os.environ.get(CONTROL_DIR_ENV)
    return Path(value) if value else None
