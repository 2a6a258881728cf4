"""One bad request never takes the pod down: the pod's own command on the real vLLM-Omni server,
sent what a careless or hostile client sends.

Each request the server cannot serve for its content is answered 4xx, naming the field, and the
next good request is served by the same processes: the supervisor, ``vllm serve`` and stage 2's
worker keep their pids, ``/readyz`` and vLLM's ``/health`` stay 200. The fuzzer sends the
regression cases (:data:`.fuzz_cases.REGRESSIONS`, each of which once took the pod down or
answered 5xx) and then seeded cases of both families, a few at a time beside a good request, so
a bad request shares stage 2's forwards with one that must be served. A 5xx fails the run: the
tiny model and the CPU platform give the server no fault of its own to answer with one.

This module sorts before ``test_real_server.py``, whose last test kills the pod's stage 2.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from minicpm_speech_runtime.serving.warmup import synthetic_voice_uri

from .conftest import Pod, http_get, skip_outside_lane
from .fuzz_cases import REGRESSIONS, Case, data_uri, draw, encode, noise, speech_body, wav_bytes

skip_outside_lane()

pytestmark = pytest.mark.timeout(1800)
SEED = int(os.environ.get("MINICPM_SPEECH_FUZZ_SEED", "20261207"))
COUNT = int(os.environ.get("MINICPM_SPEECH_FUZZ_CASES", "200"))
GROUP = 8  # cases sent at once, beside one good request
TIME_BUDGET_S = 900.0
REQUEST_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    seconds: float

    def error(self) -> dict[str, Any]:
        try:
            document = json.loads(self.body)
        except ValueError:
            return {}
        error = document.get("error") if isinstance(document, dict) else None
        return error if isinstance(error, dict) else {}


def send(pod: Pod, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> Answer:
    request = urllib.request.Request(
        f"{pod.base}/v1/chat/completions", data=body,
        headers={"Content-Type": "application/json", **dict(headers)}, method="POST")
    begin = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as r:
            return Answer(int(r.status), r.read(), time.monotonic() - begin)
    except urllib.error.HTTPError as exc:
        return Answer(int(exc.code), exc.read(), time.monotonic() - begin)


def good_request(pod: Pod, seed: int = 0) -> Answer:
    return send(pod, encode(speech_body("Still serving.",
                                        ref_audio=synthetic_voice_uri(seed=seed % 64))))


def served(answer: Answer) -> bool:
    if answer.status != 200:
        return False
    (choice,) = json.loads(answer.body)["choices"]
    return bool((choice["message"].get("audio") or {}).get("data"))


@dataclass(frozen=True)
class Processes:
    """What a restart of the pod or of one of its stages would change."""

    supervisor: int
    server: int
    stage2: int

    @staticmethod
    def of(pod: Pod) -> Processes:
        return Processes(pod.process.pid, pod.server_pid(),
                         int(pod.control_file("plugin.json")["pid"]))


def assert_pod_unharmed(pod: Pod, processes: Processes, after: str) -> None:
    assert pod.process.poll() is None, f"the supervisor exited after {after}\n{pod.log_tail()}"
    assert Processes.of(pod) == processes, f"a process was restarted after {after}"
    assert http_get(f"{pod.health}/readyz")[0] == 200, f"unready after {after}"
    assert http_get(f"{pod.base}/health")[0] == 200, f"vLLM unhealthy after {after}"


@pytest.mark.parametrize("case", REGRESSIONS, ids=[c.name for c in REGRESSIONS])
def test_a_case_that_once_broke_the_pod_is_answered_and_the_next_is_served(
        pod: Pod, case: Case) -> None:
    """Content the server cannot serve is answered 4xx naming its field, by the API server's
    check before the pipeline; the rest is served (a one-token reply: its text, no audio).
    Either way the pod serves on."""
    processes = Processes.of(pod)
    answer = send(pod, case.body, case.headers)
    assert answer.status < 500, f"{case.name}: {answer.status} {answer.body[:300]!r}"
    if case.must_refuse:
        assert 400 <= answer.status < 500, f"{case.name}: {answer.status} {answer.body[:300]!r}"
        assert answer.error().get("param"), f"{case.name}: no field named: {answer.body!r}"
        # refused by the API server's own check, before the pipeline, not contained later
        assert case.says in answer.error().get("message", ""), answer.body[:300]
    assert served(good_request(pod)), f"not served after {case.name}"
    assert_pod_unharmed(pod, processes, case.name)


def test_a_voice_stage_2_refuses_fails_its_request_alone_with_an_error(pod: Pod) -> None:
    """A reference that passes the door (8 s, audible at the end) but whose first 6 s are
    silence: vLLM-Omni keeps only those (``ref_audio_max_seconds``), and stage 2's preparation
    refuses silence. That request is answered 400 naming ``ref_audio``, by way of stage 2's
    refusal record; the good request sent beside it, in the same forwards, gets its audio.
    Streamed, the same request ends with an error event naming the reason, then ``[DONE]``."""
    processes = Processes.of(pod)
    rate = 24000
    x = np.concatenate([np.zeros(int(6.5 * rate)), noise(np.random.default_rng(3), 1.5, rate)])
    late_voice = encode(speech_body("Late voice.", ref_audio=data_uri(wav_bytes(x, rate))))
    with ThreadPoolExecutor(max_workers=2) as pool:
        refused = pool.submit(send, pod, late_voice)
        beside = pool.submit(good_request, pod, 5)
        refused_answer, beside_answer = refused.result(), beside.result()
    assert refused_answer.status == 400, refused_answer.body[:500]
    error = refused_answer.error()
    assert error.get("param") == "ref_audio" and "silent" in error.get("message", ""), error
    assert served(beside_answer), beside_answer.body[:300]
    streamed = send(pod, encode({**json.loads(late_voice), "stream": True}))
    assert streamed.status == 200, "a stream's status is sent before stage 2 sees the voice"
    events = [json.loads(line[len(b"data:"):]) for line in streamed.body.splitlines()
              if line.startswith(b"data:") and line.strip() != b"data: [DONE]"]
    errors = [e["error"] for e in events if "error" in e]
    assert errors and "silent" in errors[-1]["message"], events[-2:]
    assert streamed.body.rstrip().endswith(b"data: [DONE]")
    assert served(good_request(pod))
    assert list((pod.control / "refusals").glob("*.json")) == [], "a record was left unread"
    assert_pod_unharmed(pod, processes, "a voice stage 2 refused")


def stereo_flac(seconds: float, rate: int) -> bytes:
    import io

    import soundfile as sf

    rng = np.random.default_rng(4)
    buffer = io.BytesIO()
    sf.write(buffer, np.stack([noise(rng, seconds, rate)] * 2, axis=1), rate, format="FLAC")
    return buffer.getvalue()


UNUSUAL_VOICES = [
    # (name, ref_audio, status, what the answer or the server's log says)
    ("328 s of 16 kHz PCM", lambda: data_uri(wav_bytes(
        noise(np.random.default_rng(5), 328.0, 16000), 16000, tag=1, bits=16)),
     400, "(too-long)"),
    ("stereo 8 kHz 32-bit PCM WAV", lambda: data_uri(wav_bytes(
        np.repeat(noise(np.random.default_rng(6), 3.0, 8000), 2), 8000, tag=1, bits=32,
        channels=2)), 400, "(multi-channel)"),
    ("stereo 22.05 kHz FLAC", lambda: data_uri(stereo_flac(3.0, 22050), "audio/flac"),
     200, ""),
    ("29 s of 8 kHz PCM", lambda: data_uri(wav_bytes(
        noise(np.random.default_rng(7), 29.0, 8000), 8000, tag=1, bits=16)),
     200, "Reference audio is 29.00s, truncating to the 6.00s window"),
]


@pytest.mark.parametrize(("name", "ref_audio", "status", "says"), UNUSUAL_VOICES,
                         ids=[v[0] for v in UNUSUAL_VOICES])
def test_what_the_served_path_refuses_trims_or_converts(
        pod: Pod, name: str, ref_audio: Any, status: int, says: str) -> None:
    """What the README's "Bad input" says of voices past the rules or beside them: refused at
    the door with the rule named, or served after vLLM-Omni downmixes (a container other than
    WAV, through vLLM's media loader), resamples to 24 kHz and keeps the first
    ``ref_audio_max_seconds`` (6 s) of it."""
    processes = Processes.of(pod)
    log_before = len(pod.log_tail(10**8))
    answer = send(pod, encode(speech_body("Unusual voice.", ref_audio=ref_audio())))
    assert answer.status == status, f"{name}: {answer.status} {answer.body[:300]!r}"
    if status == 200:
        assert served(answer)
        assert says in pod.log_tail(10**8)[log_before:], f"{name}: the log does not say {says}"
    else:
        assert answer.error().get("param") == "ref_audio" and says in answer.error()["message"]
    assert_pod_unharmed(pod, processes, name)


def test_the_request_fuzzer_finds_no_5xx_and_no_restart(pod: Pod, tmp_path: Path) -> None:
    processes = Processes.of(pod)
    cases = [*REGRESSIONS, *draw(SEED, COUNT)]
    begin = time.monotonic()
    results: list[tuple[Case, Answer]] = []
    failures: list[str] = []
    for at in range(0, len(cases), GROUP):
        group = cases[at:at + GROUP]
        with ThreadPoolExecutor(max_workers=GROUP + 1) as pool:
            beside = pool.submit(good_request, pod, at)
            sent = [pool.submit(send, pod, c.body, c.headers) for c in group]
            answers = [f.result() for f in sent]
            beside_answer = beside.result()
        for case, answer in zip(group, answers, strict=True):
            results.append((case, answer))
            if answer.status >= 500:
                failures.append(f"{case.name}: {answer.status} {answer.body[:300]!r}")
            elif case.must_refuse and answer.status < 400:
                failures.append(f"{case.name}: served ({answer.status}), should be refused")
        after = ", ".join(c.name for c in group)
        if not served(beside_answer):
            failures.append(f"a good request beside {after}: {beside_answer.status} "
                            f"{beside_answer.body[:300]!r}")
        assert_pod_unharmed(pod, processes, after)
        assert served(good_request(pod, at + 1)), f"the next good request after {after}"
        assert time.monotonic() - begin < TIME_BUDGET_S, f"over {TIME_BUDGET_S:.0f} s"
    elapsed = time.monotonic() - begin
    report(results, elapsed, tmp_path / "fuzz.json")
    assert len(results) >= 200
    assert not failures, "\n".join(failures)


def report(results: list[tuple[Case, Answer]], elapsed: float, path: Path) -> None:
    """A table of what each class of case was answered, and the same as JSON."""
    by_class: dict[str, Counter[int]] = {}
    for case, answer in results:
        by_class.setdefault(case.family, Counter())[answer.status] += 1
    print(f"\nfuzzer: {len(results)} cases in {elapsed:.0f} s (seed {SEED})")
    print(f"{'class':<28} answers")
    for family, counts in sorted(by_class.items()):
        print(f"{family:<28} " + ", ".join(f"{s}: {n}" for s, n in sorted(counts.items())))
    path.write_text(json.dumps({
        "seed": SEED, "cases": len(results), "seconds": round(elapsed, 1),
        "answers": [{"case": c.name, "status": a.status, "seconds": round(a.seconds, 3),
                     "error": a.error().get("message", "")[:300]} for c, a in results],
    }, indent=1))
