"""Reference voices from request arrival to stage 2, ahead of the request's first window.

vLLM-Omni learns a request's reference voice in the API server, where its orchestrator submits
the request to stage 0 and, in async-chunk mode, pre-submits the later stages
(``Orchestrator._prewarm_async_chunk_stages``). Stage 2 sees the voice only with the request's
first codec window, after the Thinker's prefill and the Talker's first 25 codes. The plugin
wraps that orchestrator method to spool the voice here, keyed by request id, and stage 2's
:class:`ArrivalWatcher` hands each spooled voice to vLLM-Omni's own reference normalisation
(``_materialize_runtime_prompt``, which the plugin also wraps to start preparation), so chunk 0
finds the voice prepared. Nothing here imports vLLM-Omni.

The spool is a directory both processes see (``arrivals/`` under the control directory). One
file per request, written atomically, named by a hash of the request id::

    b"MCSR" | u8 version | f64 arrival time (epoch s) | u32 sample rate | u32 samples | f32[samples]

Everything read back is bounded and checked (:func:`read_spooled`); a file that fails the
checks, or that nobody picked up within :data:`MAX_AGE_S`, is removed and counted. A full or
unwritable spool skips the early start: the request is prepared at chunk 0 as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ARRIVALS_SUBDIR = "arrivals"
MAGIC = b"MCSR"
VERSION = 1
_HEADER = struct.Struct("<4sBdII")
SUFFIX = ".ref"
# A reference longer than this is refused at the spool; vLLM-Omni truncates references to its
# ``ref_audio_max_seconds`` window (6 s by default) anyway.
MAX_SAMPLES = 60 * 48_000
MAX_SAMPLE_RATE = 192_000
MAX_FILES = 512  # requests spooled and not yet picked up; beyond it arrivals skip the spool
MAX_AGE_S = 120.0  # an arrival nobody picked up by then belongs to a request that is gone
POLL_S = 0.005


class BadSpoolFile(ValueError):
    """A spool file that is not a whole, bounded reference."""


@dataclass(frozen=True)
class Arrival:
    request_id_hash: str
    arrived_at: float  # epoch seconds, the API server's clock (same host)
    samples: np.ndarray  # float32, mono
    sample_rate: int


def spool_name(request_id: str) -> str:
    return hashlib.sha256(request_id.encode("utf-8", "replace")).hexdigest()[:32] + SUFFIX


def spool_reference(
    spool_dir: Path, request_id: str, samples: np.ndarray, sample_rate: int,
    now: float | None = None,
) -> Path | None:
    """Spool one request's reference; None (and a debug log) when it is not spooled."""
    wave = np.ascontiguousarray(np.asarray(samples, dtype="<f4").reshape(-1))
    if not 0 < wave.size <= MAX_SAMPLES or not 0 < int(sample_rate) <= MAX_SAMPLE_RATE:
        log.debug("arrivals: reference of %d samples at %s Hz not spooled", wave.size,
                  sample_rate)
        return None
    try:
        spool_dir.mkdir(parents=True, exist_ok=True)
        if _count(spool_dir) >= MAX_FILES:
            log.warning("arrivals: %s holds %d references; preparing at chunk 0 instead",
                        spool_dir, MAX_FILES)
            return None
        header = _HEADER.pack(MAGIC, VERSION, time.time() if now is None else now,
                              int(sample_rate), wave.size)
        target = spool_dir / spool_name(request_id)
        fd, tmp = tempfile.mkstemp(dir=spool_dir, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(wave.tobytes())
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as exc:
        log.warning("arrivals: cannot spool a reference in %s (%s)", spool_dir, exc)
        return None
    return target


def read_spooled(path: Path) -> Arrival:
    """One spooled reference, checked before its samples are read."""
    size = path.stat().st_size
    if size < _HEADER.size or size > _HEADER.size + 4 * MAX_SAMPLES:
        raise BadSpoolFile(f"{path.name}: {size} bytes is not a spooled reference")
    with path.open("rb") as f:
        magic, version, arrived, rate, n = _HEADER.unpack(f.read(_HEADER.size))
        if magic != MAGIC or version != VERSION:
            raise BadSpoolFile(f"{path.name}: not a version-{VERSION} spool file")
        if not 0 < n <= MAX_SAMPLES or not 0 < rate <= MAX_SAMPLE_RATE:
            raise BadSpoolFile(f"{path.name}: {n} samples at {rate} Hz is out of bounds")
        if size != _HEADER.size + 4 * n:
            raise BadSpoolFile(f"{path.name}: {size} bytes for {n} samples")
        samples = np.frombuffer(f.read(4 * n), dtype="<f4").astype(np.float32)
    if not np.isfinite(arrived):
        raise BadSpoolFile(f"{path.name}: arrival time is not a number")
    return Arrival(path.name.removesuffix(SUFFIX), float(arrived), samples, int(rate))


def _count(directory: Path) -> int:
    with os.scandir(directory) as entries:
        return sum(1 for e in entries if e.name.endswith(SUFFIX))


class ArrivalWatcher:
    """Stage 2's side: a thread that takes each spooled reference once, oldest first."""

    def __init__(
        self,
        spool_dir: Path,
        on_arrival: Callable[[Arrival], None],
        on_outcome: Callable[[str], None] = lambda outcome: None,
        poll_s: float = POLL_S,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self.spool_dir = spool_dir
        self.on_arrival = on_arrival
        self.on_outcome = on_outcome
        self.poll_s = poll_s
        self.max_age_s = max_age_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="voice-arrivals", daemon=True)

    def start(self) -> ArrivalWatcher:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def poll_once(self) -> int:
        """Take every spooled reference now; returns how many were handed over."""
        try:
            with os.scandir(self.spool_dir) as entries:
                found = [Path(e.path) for e in entries if e.name.endswith(SUFFIX)]
        except OSError:
            return 0
        handed = 0
        for path in sorted(found, key=_mtime):
            handed += self._take(path)
        return handed

    def _take(self, path: Path) -> int:
        try:
            arrival = read_spooled(path)
        except FileNotFoundError:
            return 0
        except (OSError, BadSpoolFile, struct.error) as exc:
            log.warning("arrivals: %s", str(exc)[:300])
            path.unlink(missing_ok=True)
            self.on_outcome("bad_file")
            return 0
        path.unlink(missing_ok=True)
        if time.time() - arrival.arrived_at > self.max_age_s:
            self.on_outcome("expired")
            return 0
        try:
            self.on_arrival(arrival)
        except Exception as exc:  # the request is prepared at chunk 0 instead, or fails there
            log.warning("arrivals: early preparation not started (%s)",
                        f"{type(exc).__name__}: {exc}"[:300])
            self.on_outcome("failed")
            return 0
        self.on_outcome("taken")
        return 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # one bad pass never ends the watcher
                log.exception("arrivals: watcher pass failed")
            self._stop.wait(self.poll_s)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
