"""Asynchronous reference-voice preparation with a content-keyed cache.

When a request arrives (:meth:`VoicePrep.submit`) its reference audio is spooled to a file the
request owns and a job is queued for a bounded pool of worker threads. A worker runs the host
half, looks the voice up by the content hash of its normalised audio, and, for a new voice,
enqueues the device half on a side CUDA stream and records an event. At chunk 0 the engine
calls :meth:`VoicePrep.acquire`: a finished job's result is used after making the current
stream wait on that event (no host synchronisation); an unfinished, failed or never-queued job
is replaced by inline preparation on the caller's stream. :meth:`release` ends a request;
:meth:`cancel` ends it early, in any state of its job.

Invariants the tests check: a settled request leaves no spool file, no staging buffer and no
pin; a voice shared by live requests keeps its entry until the last of them lets go; unpinned
entries that served a request stay cached, least recently used first out.
"""

from __future__ import annotations

import contextlib
import enum
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .counters import PrepCounters
from .device import DeviceHalf, PreparedVoice
from .host import HostFeatures, prepare_host
from .wav import BadReference


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(eq=False)
class _Entry:
    key: str
    voice: PreparedVoice
    event: torch.cuda.Event | None
    pins: set[str] = field(default_factory=set)
    used: bool = False  # served at least one chunk 0


@dataclass(eq=False)
class _Job:
    request_id: str
    spool: Path | None
    state: JobState = JobState.QUEUED
    key: str | None = None
    cached: bool = False
    error: BaseException | None = None
    cancelled: bool = False  # the request is gone (released or cancelled)
    acquired: bool = False  # chunk 0 has taken its voice
    done_at: float | None = None  # epoch seconds its voice was ready (device work enqueued)
    settled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True)
class PrepConfig:
    workers: int = 4
    queue_size: int = 64
    cache_size: int = 256
    spool_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.workers < 1 or self.queue_size < 1 or self.cache_size < 1:
            raise ValueError("workers, queue_size and cache_size must be positive")


class VoicePrep:
    """Bounded worker pool + content-keyed LRU cache with per-request pins."""

    def __init__(
        self,
        device_half: DeviceHalf,
        config: PrepConfig | None = None,
        host_fn: Callable[[bytes], HostFeatures] = prepare_host,
    ) -> None:
        self.config = config or PrepConfig()
        self.device_half = device_half
        self.device = device_half.device
        self.host_fn = host_fn
        self.counters = PrepCounters()
        self._own_spool = self.config.spool_dir is None
        self.spool_dir = Path(self.config.spool_dir or tempfile.mkdtemp(prefix="voice-spool-"))
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[_Job] = deque()
        self._jobs: dict[str, _Job] = {}
        self._inflight: set[_Job] = set()  # queued or running, cancelled ones included
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._closed = False
        self._side = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            if self.device.type == "cuda"
            else None
        )
        self._threads = [
            threading.Thread(target=self._worker, name=f"voice-prep-{i}", daemon=True)
            for i in range(self.config.workers)
        ]
        for t in self._threads:
            t.start()

    # ---------------------------------------------------------------- request lifecycle

    def submit(self, request_id: str, data: bytes) -> bool:
        """Queue preparation for a new request; False when the pool is full (inline later)."""
        with self._lock:
            if request_id in self._jobs:
                raise ValueError(f"request {request_id} already submitted")
            if self._closed or len(self._queue) >= self.config.queue_size:
                self.counters.add("queue_full")
                self._jobs[request_id] = _Job(request_id, None, JobState.FAILED, cached=False)
                self._jobs[request_id].error = _QueueFull()
                return False
            job = _Job(request_id, self._spool_path(request_id))
            self._jobs[request_id] = job
        try:
            _write_atomic(job.spool, data)  # type: ignore[arg-type]
        except OSError as exc:
            with self._lock:
                job.state, job.error = JobState.FAILED, exc
            _unlink(job.spool)
            return False
        with self._wake:
            if job.cancelled:  # cancelled while the file was being written
                _unlink(job.spool)
                return False
            self._queue.append(job)
            self._inflight.add(job)
            self._wake.notify()
        return True

    def acquire(self, request_id: str, data: bytes | None = None) -> PreparedVoice:
        """The request's prepared voice for chunk 0; never waits on the host for the device.

        ``data`` is the reference audio, needed only if the request was never submitted.
        Raises :class:`BadReference` when the audio is unusable.
        """
        with self._lock:
            job = self._jobs.get(request_id)
            if job is not None:
                job.acquired = True
            if job is None:
                outcome = "inline"
            elif job.state is JobState.DONE:
                entry = self._cache[job.key]  # type: ignore[index]
                entry.used = True
                self._cache.move_to_end(entry.key)
                self.counters.add("cached" if job.cached else "ahead")
                return self._consume(entry)
            elif job.state is JobState.FAILED:
                outcome = "queue_full" if isinstance(job.error, _QueueFull) else "failed"
                if outcome == "failed" and isinstance(job.error, BadReference):
                    self.counters.add("failed")
                    raise job.error
                if outcome == "failed":
                    self.counters.add("failed")
            else:
                outcome = "late"
                if job.state is JobState.QUEUED:
                    self._queue.remove(job)
                    self._inflight.discard(job)
                    job.state = JobState.FAILED
                    job.error = _Superseded()
                    job.settled.set()
                self.counters.add("late")
            if outcome == "inline":
                self.counters.add("inline")
            spool = job.spool if job is not None else None
        if data is None:
            if spool is None:
                raise ValueError(f"request {request_id}: no job and no reference audio")
            data = spool.read_bytes()
        return self._inline(request_id, data)

    def release(self, request_id: str) -> None:
        """The request is over: drop its pin and its spool file."""
        self._finish(request_id, cancelled=False)

    def cancel(self, request_id: str) -> None:
        """The request was cancelled; its job, in whatever state, leaves nothing behind."""
        self._finish(request_id, cancelled=True)

    # ---------------------------------------------------------------- inspection

    def live_spool_files(self) -> list[Path]:
        return sorted(self.spool_dir.iterdir()) if self.spool_dir.exists() else []

    def cache_keys(self) -> list[str]:
        with self._lock:
            return list(self._cache)

    def pins(self) -> dict[str, set[str]]:
        with self._lock:
            return {k: set(e.pins) for k, e in self._cache.items() if e.pins}

    def prepared_at(self, request_id: str) -> float | None:
        """When the request's job had its voice ready (epoch s); None unless prepared ahead."""
        with self._lock:
            job = self._jobs.get(request_id)
            return None if job is None else job.done_at

    def preparing(self, request_id: str) -> bool:
        """Whether the request's job is still queued or running."""
        with self._lock:
            job = self._jobs.get(request_id)
            return job is not None and job.state in (JobState.QUEUED, JobState.RUNNING)

    def pending_jobs(self) -> int:
        with self._lock:
            return len(self._jobs)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no job is queued or running (tests and benchmarks)."""
        with self._lock:
            jobs = list(self._inflight)
        return all(j.settled.wait(timeout) for j in jobs)

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        for t in self._threads:
            t.join()
        with self._lock:
            live = list(self._jobs)
        for request_id in live:  # requests still open at shutdown leave nothing either
            self._finish(request_id, cancelled=True)
        if self._own_spool:
            shutil.rmtree(self.spool_dir, ignore_errors=True)

    # ---------------------------------------------------------------- internals

    def _spool_path(self, request_id: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in request_id)[:100]
        return self.spool_dir / f"{safe}-{os.getpid()}-{id(object()):x}.wav"

    def _consume(self, entry: _Entry) -> PreparedVoice:
        if entry.event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(entry.event)
            # The side stream's allocator must not reuse these blocks while this stream may
            # still read them; record_stream mutates metadata of inference tensors, so it
            # runs in inference mode like the code that made them.
            with torch.inference_mode():
                for t in entry.voice.tensors():
                    t.record_stream(stream)
        return entry.voice

    def _inline(self, request_id: str, data: bytes) -> PreparedVoice:
        self.counters.add("inline_runs")
        voice = self.device_half.run(self.host_fn(data))
        with self._lock:
            entry = self._cache.get(voice.key)
            if entry is None:
                entry = _Entry(voice.key, voice, None)
                self._cache[voice.key] = entry
            entry.pins.add(request_id)
            entry.used = True
            self._cache.move_to_end(voice.key)
            job = self._jobs.get(request_id)
            if job is not None and job.key is not None and job.key != voice.key:
                self._unpin(job.key, request_id)
            if job is None:
                self._jobs[request_id] = _Job(
                    request_id, None, JobState.DONE, key=voice.key, acquired=True
                )
            else:
                job.key = voice.key
            self._evict()
        return voice

    def _finish(self, request_id: str, cancelled: bool) -> None:
        with self._lock:
            job = self._jobs.pop(request_id, None)
            if job is None:
                return
            if not job.acquired and not isinstance(job.error, _QueueFull):
                self.counters.add("abandoned")  # ended before chunk 0, either way
            job.cancelled = True
            if job.state is JobState.QUEUED:
                if job in self._queue:  # not yet there while submit() writes the file
                    self._queue.remove(job)
                self._inflight.discard(job)
                job.state = JobState.FAILED
                job.settled.set()
            running = job.state is JobState.RUNNING
            if job.key is not None:
                self._unpin(job.key, request_id)
        if not running:
            # A running job removes its spool file itself when it settles.
            _unlink(job.spool)

    def _unpin(self, key: str, request_id: str) -> None:
        entry = self._cache.get(key)
        if entry is None:
            return
        entry.pins.discard(request_id)
        if not entry.pins and not entry.used:
            # Prepared for requests that all went away before chunk 0: nothing to keep.
            del self._cache[key]

    def _evict(self) -> None:
        while len(self._cache) > self.config.cache_size:
            victim = next((k for k, e in self._cache.items() if not e.pins), None)
            if victim is None:
                return  # everything is pinned by live requests
            del self._cache[victim]

    def _worker(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if self._closed and not self._queue:
                    return
                job = self._queue.popleft()
                job.state = JobState.RUNNING
            try:
                self._run_job(job)
            except BaseException as exc:
                with self._lock:
                    job.state, job.error = JobState.FAILED, exc
            finally:
                with self._lock:
                    orphaned = job.cancelled
                if orphaned:
                    _unlink(job.spool)
                with self._lock:
                    self._inflight.discard(job)
                job.settled.set()

    def _run_job(self, job: _Job) -> None:
        data = job.spool.read_bytes()  # type: ignore[union-attr]
        host = self.host_fn(data)
        with self._lock:
            if job.cancelled:
                return
            entry = self._cache.get(host.key)
            if entry is not None:
                entry.pins.add(job.request_id)
                self._cache.move_to_end(host.key)
                job.key, job.cached, job.state = host.key, True, JobState.DONE
                job.done_at = time.time()
                return
        voice, event = self._device(host)
        with self._lock:
            if job.cancelled:
                return  # dropped here: its tensors and staging buffers go with it
            entry = self._cache.get(host.key)
            if entry is None:
                entry = _Entry(host.key, voice, event)
                self._cache[host.key] = entry
            else:
                job.cached = True  # another job installed the same voice meanwhile
            entry.pins.add(job.request_id)
            self._cache.move_to_end(host.key)
            job.key, job.state = host.key, JobState.DONE
            job.done_at = time.time()
            self._evict()

    def _device(self, host: HostFeatures) -> tuple[PreparedVoice, torch.cuda.Event | None]:
        if self._side is None:
            return self.device_half.run(host), None
        with torch.cuda.stream(self._side):
            voice = self.device_half.run(host)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._side)  # type: ignore[no-untyped-call]
        return voice, event


class _QueueFull(Exception):
    pass


class _Superseded(Exception):
    """A queued job taken over by inline preparation at chunk 0."""


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".part")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        _unlink(tmp)


def _unlink(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
