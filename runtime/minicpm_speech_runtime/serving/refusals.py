"""Stage 2's word to the API server that it refused one request, so that client gets an error.

vLLM-Omni 0.30 gives stage 2 no way to fail one request: its model's ``forward`` either returns
audio for every request of the step or raises, and a raise ends the stage's engine process and
every stream on the pod. So when stage 2 cannot use a request's reference voice (the API server
checks voices before they enter the pipeline, :mod:`.request_checks`; this is what is left),
the plugin serves that request no audio and records the refusal here; the API server's chat
handler looks for its request's record with each output it reads and ends the request with a
400 naming ``ref_audio`` (an error event when streamed), aborting its work in every stage.

One JSON file per refused request under ``refusals/`` in the control directory, written
atomically and named by the request id stage 2 was given, which is the API server's own id
with vLLM's per-engine suffix (``-`` and 8 characters), so the API server finds its record by
prefix. Files are bounded in count and age: a record nobody read (its client went away) is
removed by later writes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .control import write_json

log = logging.getLogger(__name__)

REFUSALS_SUBDIR = "refusals"
# The prompt id stage 2 gives a request whose voice it refused: no file and no table entry
# stand behind it, and the backend serves it no audio; the reason follows the prefix.
REFUSED_PROMPT = "minicpm-speech-refused:"
IO_ERROR = "io-error"  # the stage's own disk failed: the server's fault, answered 500
SUFFIX = ".json"
MAX_FILES = 1024
MAX_AGE_S = 600.0
MAX_NAME = 160
MAX_MESSAGE = 300
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_ENGINE_SUFFIX = re.compile(r"(-[0-9A-Za-z]{8})?")


@dataclass(frozen=True)
class Refusal:
    reason: str
    message: str


def file_stem(request_id: str) -> str:
    """A request id as a file name: unsafe characters replaced, bounded in length."""
    return _UNSAFE.sub("_", request_id)[:MAX_NAME] or "_"


def record_refusal(directory: Path, request_id: str, reason: str, message: str,
                   now: float | None = None) -> Path | None:
    """Record that stage 2 refused ``request_id``; None (and a warning) when it cannot."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _prune(directory, time.time() if now is None else now)
        return write_json(directory, file_stem(request_id) + SUFFIX,
                          {"reason": reason[:80], "message": message[:MAX_MESSAGE]})
    except OSError as exc:
        log.warning("refusal of request %s not recorded (%s); its client gets no audio and no "
                    "error", request_id[:100], exc)
        return None


def take_refusal(directory: Path | None, request_id: str) -> Refusal | None:
    """The refusal recorded for ``request_id`` (the API server's id), removed as it is read."""
    if directory is None:
        return None
    stem = file_stem(request_id)
    try:
        names = [n for n in os.listdir(directory) if n.startswith(stem) and n.endswith(SUFFIX)]
    except OSError:
        return None
    for name in names:
        if not _ENGINE_SUFFIX.fullmatch(name[len(stem):-len(SUFFIX)]):
            continue  # another request whose id begins with this one's
        path = directory / name
        try:
            document = json.loads(path.read_text())
            path.unlink(missing_ok=True)
        except (OSError, ValueError):
            continue
        if isinstance(document, dict):
            return Refusal(str(document.get("reason", "refused"))[:80],
                           str(document.get("message", ""))[:MAX_MESSAGE])
    return None


def _prune(directory: Path, now: float) -> None:
    entries = []
    for path in directory.glob("*" + SUFFIX):
        try:
            entries.append((path.stat().st_mtime, path))
        except OSError:
            continue
    entries.sort()
    excess = len(entries) - (MAX_FILES - 1)
    for i, (mtime, path) in enumerate(entries):
        if i < excess or now - mtime > MAX_AGE_S:
            path.unlink(missing_ok=True)
