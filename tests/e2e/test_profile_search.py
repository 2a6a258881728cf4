"""spec.profile.search with the real operator process: candidates benchmarked one at a time by
perf Jobs whose figures a script sets per candidate, the winner served through the gate, a
restart mid-search, and an SLO no candidate meets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import jsonschema
import pytest
from minicpm_speech_operator.crd_schema import strict_json_schema, version_schema
from minicpm_speech_perf.summarize import sweep_message

from tests.harness.cluster import Cluster
from tests.harness.kopf_runner import Operator

from .journey import HASH_LABEL, NAME, children, condition, create_and_settle, events
from .perf_journey import FINISHED, STARTED, finish, jobs, perf_spec, point, wer_result

pytestmark = pytest.mark.usefixtures("emulated_only")

STATUS_SCHEMA = jsonschema.Draft4Validator(
    strict_json_schema(version_schema()["properties"]["status"]))
KIND_LABEL = "serving.minicpm-speech.io/perf-kind"


@pytest.fixture
def emulated_only(cluster: Cluster) -> None:
    if not cluster.is_emulated:
        pytest.skip("completion is simulated by writing Job and pod status")


# What each candidate's fake server measures at C8: audio-s/s, first-audio p95 ms, WER %.
PICK = {
    "default": (20.0, 900.0, 3.0),
    "high-concurrency/precision=fp32": (30.0, 1500.0, 3.0),  # fastest, but too slow to start
    "high-concurrency/precision=bf16-cache": (26.0, 1000.0, 3.5),  # meets every target
}
UNMEETABLE = {
    "default": (20.0, 900.0, 3.0),  # p95 80 % over
    "high-concurrency": (30.0, 600.0, 3.0),  # p95 20 % over: the closest
    "low-latency": (12.0, 550.0, 3.0),  # p95 10 % over and 20 % short of 15 audio-s/s
}


def search_spec(profiles: list[str], grid: dict[str, Any] | None = None,
                **slo: Any) -> dict[str, Any]:
    # The gate allows the winner's later first audio: the SLO, not the gate, bounds it.
    spec = perf_spec(gate={"maxFirstAudioP95RisePercent": 50})
    spec["profile"] = {"name": "default", "search": {
        "enabled": True, "profiles": profiles, **({"grid": grid} if grid else {})}}
    spec["slo"] = {"concurrency": 8, "minAudioSecondsPerSecond": 15, **slo}
    return spec


def search_status(cluster: Cluster) -> dict[str, Any]:
    speech = cluster.api.get_speech(NAME) or {}
    found: dict[str, Any] = (speech.get("status") or {}).get("profileSearch") or {}
    return found


def labels_by_hash(cluster: Cluster) -> dict[str, str]:
    return {row["configHash"]: row["candidate"]
            for row in search_status(cluster).get("candidates") or [] if row.get("configHash")}


def active(cluster: Cluster) -> list[dict[str, Any]]:
    return [j for j in jobs(cluster) if not (j.get("status") or {}).get("conditions")]


def sweep_of(config_hash: str, tput: float, p95: float) -> str:
    points = [point("B", c, tput * c / 8, p95) for c in (1, 8)]
    return sweep_message({"config_hash": config_hash, "mode": "dedicated", "started": STARTED,
                          "finished": FINISHED, "baseline": None}, points)


def play_jobs(cluster: Cluster, script: Mapping[str, tuple[float, float, float]],
              running_hashes: list[set[str]]) -> int:
    """Finish every running perf Job with its candidate's scripted figures, as its pod and
    the Job controller would; returns how many were finished."""
    names = labels_by_hash(cluster)
    running = active(cluster)
    running_hashes.append({j["metadata"]["labels"][HASH_LABEL] for j in running})
    finished = 0
    for job in running:
        config_hash = job["metadata"]["labels"][HASH_LABEL]
        if config_hash not in names:
            continue
        tput, p95, wer = script[names[config_hash]]
        if job["metadata"]["labels"][KIND_LABEL] == "sweep":
            finish(cluster, job, sweep_of(config_hash, tput, p95))
        else:
            finish(cluster, job, wer_result(config_hash, wer / 100))
        finished += 1
    return finished


async def search_until(cluster: Cluster, script: Mapping[str, tuple[float, float, float]],
                       phase: str, running_hashes: list[set[str]]) -> dict[str, Any]:
    async def decided() -> dict[str, Any] | None:
        await asyncio.to_thread(play_jobs, cluster, script, running_hashes)
        found = search_status(cluster)
        return found if found.get("phase") == phase else None

    result: dict[str, Any] = await cluster.wait_for(decided, timeout=90, interval=0.3,
                                                    message=f"profile search {phase}")
    return result


def assert_valid_status(cluster: Cluster) -> None:
    status = (cluster.api.get_speech(NAME) or {})["status"]
    errors = [e.message for e in STATUS_SCHEMA.iter_errors(status)]
    assert errors == [], errors  # a field the CRD lacks would be dropped by the API server


def print_table(found: Mapping[str, Any]) -> None:
    print("status.profileSearch:\n" + json.dumps(found, indent=1))


async def test_the_search_serves_the_fastest_candidate_that_meets_the_slo(
        cluster: Cluster, operator: Operator) -> None:
    spec = search_spec(["high-concurrency"], {"precision": ["fp32", "bf16-cache"]},
                       firstAudioP95Ms=1200, maxWerDeltaPoints=1.0)
    own = (await create_and_settle(cluster, spec))["status"]["configHash"]
    running: list[set[str]] = []
    found = await search_until(cluster, PICK, "Chosen", running)
    print_table(found)
    rows = {row["candidate"]: row for row in found["candidates"]}
    assert list(rows) == list(PICK)  # the spec's own profile first
    winner = rows["high-concurrency/precision=bf16-cache"]
    assert found["winner"] == winner["candidate"] and winner["result"] == "Winner"
    assert (winner["werPercent"], winner["werDeltaPoints"]) == (3.5, 0.5)
    assert rows["high-concurrency/precision=fp32"]["result"] == "MissedSlo"
    assert "first-audio p95 1500 > 1200 ms" in rows["high-concurrency/precision=fp32"]["reason"]
    assert rows["default"]["result"] == "Lost"
    assert "below the winner" in rows["default"]["reason"]
    assert found["gpuMinutes"] == 3 * 2 * 60  # three candidates, a sweep and a WER Job each
    # One candidate at a time, beside the configuration that serves.
    assert max(len(hashes - {own}) for hashes in running) <= 1
    # The winner serves, through the gate, and becomes the last good configuration.
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and
        s["status"].get("configHash") == winner["configHash"] and
        condition(s, "SLO").get("reason") == "Met" and s, message="the winner serves")
    assert speech["status"]["profile"] == "high-concurrency/precision=bf16-cache"
    await cluster.wait_for(
        lambda: (d := children(cluster)["deployment"]) and
        d["spec"]["template"]["metadata"]["annotations"][HASH_LABEL] == winner["configHash"],
        message="the Deployment runs the winner")
    await cluster.wait_for(
        lambda: (c := cluster.api.get("configmap", f"{NAME}-deploy-config-lastgood")) and
        c["data"]["config-hash"] == winner["configHash"], message="the winner passed the gate")
    assert condition(cluster.api.get_speech(NAME), "PerfGate")["status"] == "True"
    reasons = [e["reason"] for e in events(cluster)]
    assert "ProfileSearchStarted" in reasons and "ProfileChosen" in reasons
    assert_valid_status(cluster)
    # Measured once: no candidate has a second Job of a kind.
    assert all(not j["metadata"]["name"].endswith("-2") for j in jobs(cluster))


async def test_a_restart_mid_search_repeats_no_finished_candidate(
        cluster: Cluster, operator: Operator) -> None:
    spec = search_spec(["high-concurrency"], {"precision": ["fp32", "bf16-cache"]},
                       firstAudioP95Ms=1200)
    await create_and_settle(cluster, spec)
    running: list[set[str]] = []

    def two_done() -> bool:
        rows = search_status(cluster).get("candidates") or []
        if sum(r.get("state") == "Measured" for r in rows) >= 2:
            return True
        play_jobs(cluster, PICK, running)
        return False

    await cluster.wait_for(two_done, timeout=60, interval=0.3, message="two candidates measured")
    last = search_status(cluster)["candidates"][-1]["configHash"]
    await cluster.wait_for(lambda: {j["metadata"]["labels"][HASH_LABEL]
                                    for j in active(cluster)} == {last},
                           message="the last candidate's Jobs run")
    before = {j["metadata"]["name"]: j["metadata"]["uid"] for j in jobs(cluster)}
    assert len(before) == 2 * len(PICK)
    # A running candidate's config, lost, is written again: its pod cannot start without it.
    config = f"{NAME}-sweep-{last}"
    assert cluster.api.delete("configmap", config)
    await cluster.wait_for(lambda: cluster.api.get("configmap", config),
                           message="the running candidate's config is back")
    await operator.stop()
    # The last candidate's Jobs end while no operator runs.
    assert play_jobs(cluster, PICK, running) == 2
    await operator.start()
    found = await search_until(cluster, PICK, "Chosen", running)
    after = {j["metadata"]["name"]: j["metadata"]["uid"] for j in jobs(cluster)}
    assert after == before  # one sweep and one WER Job per candidate, ever: none recreated
    assert found["winner"] == "high-concurrency/precision=bf16-cache"
    assert_valid_status(cluster)


async def test_an_unmeetable_slo_is_reported_with_the_closest_candidate(
        cluster: Cluster, operator: Operator) -> None:
    spec = search_spec(["high-concurrency", "low-latency"], firstAudioP95Ms=500)
    own = (await create_and_settle(cluster, spec))["status"]["configHash"]
    found = await search_until(cluster, UNMEETABLE, "NoCandidateMeetsSlo", [])
    print_table(found)
    assert found["closest"] == "high-concurrency" and "winner" not in found
    assert "the closest is high-concurrency" in found["message"]
    assert all(row["result"] == "MissedSlo" for row in found["candidates"])
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and
        condition(s, "SLO").get("reason") == "NoCandidateMeetsSlo" and s)
    assert condition(speech, "SLO")["status"] == "False"
    assert speech["status"]["configHash"] == own  # the spec's own profile keeps serving
    warning = await cluster.wait_for(lambda: next(
        (e for e in events(cluster) if e["reason"] == "NoCandidateMeetsSlo"), None))
    assert warning["type"] == "Warning" and "high-concurrency" in warning["message"]
    assert_valid_status(cluster)


async def test_a_new_image_searches_again(cluster: Cluster, operator: Operator) -> None:
    spec = search_spec(["high-concurrency"], {"precision": ["fp32", "bf16-cache"]},
                       firstAudioP95Ms=1200)
    await create_and_settle(cluster, spec)
    first = await search_until(cluster, PICK, "Chosen", [])
    old = {row["configHash"] for row in first["candidates"]}
    cluster.api.patch_speech(NAME, {"spec": {"runtime": {
        "image": "ghcr.io/minicpm-speech/runtime:0.2.0"}}})
    searching = await cluster.wait_for(
        lambda: (s := search_status(cluster)).get("phase") == "Searching" and s,
        message="searching again")
    assert old.isdisjoint(row["configHash"] for row in searching["candidates"])
    # The spec's own profile on the new image serves until the new search decides.
    assert (cluster.api.get_speech(NAME) or {})["status"]["configHash"] == \
        searching["candidates"][0]["configHash"]
    second = await search_until(cluster, PICK, "Chosen", [])
    assert second["winner"] == first["winner"]
    assert second["winnerConfigHash"] not in old
    await cluster.wait_for(lambda: [e["reason"] for e in events(cluster)].count(
        "ProfileSearchStarted") == 2, message="a second search was announced")


async def test_a_winner_the_gate_refuses_is_rolled_back_to_the_last_good(
        cluster: Cluster, operator: Operator) -> None:
    """The SLO allows the winner's WER; the regression gate, stricter here, does not."""
    spec = search_spec(["high-concurrency"], {"precision": ["fp32", "bf16-cache"]},
                       firstAudioP95Ms=1200)
    spec["perf"] |= {"rollback": True, "gate": {"maxFirstAudioP95RisePercent": 50,
                                                "maxWerIncreasePoints": 0.2}}
    own = (await create_and_settle(cluster, spec))["status"]["configHash"]
    found = await search_until(cluster, PICK, "Chosen", [])
    winner = found["winnerConfigHash"]
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and
        condition(s, "RolledBack").get("status") == "True" and s, message="rolled back")
    assert speech["status"]["perf"]["rolledBack"] == {"fromHash": winner, "toHash": own}
    assert speech["status"]["configHash"] == own  # the last good serves again
    assert condition(speech, "QualityGate")["status"] == "False"
    assert "WER +0.50 points" in condition(speech, "QualityGate")["message"]
    assert search_status(cluster)["phase"] == "Chosen"  # the choice stands; the gate decides
    await cluster.wait_for(
        lambda: (d := children(cluster)["deployment"]) and
        d["spec"]["template"]["metadata"]["annotations"][HASH_LABEL] == own,
        message="the Deployment runs the last good configuration")
    assert_valid_status(cluster)


async def test_a_candidate_added_later_is_measured_while_the_winner_keeps_serving(
        cluster: Cluster, operator: Operator) -> None:
    script = {"default": (20.0, 900.0, 3.0), "high-concurrency": (26.0, 1000.0, 3.5),
              "low-latency": (28.0, 1100.0, 3.0)}
    spec = search_spec(["high-concurrency"], firstAudioP95Ms=1200)
    await create_and_settle(cluster, spec)
    first = await search_until(cluster, script, "Chosen", [])
    winner = first["winnerConfigHash"]
    await cluster.wait_for(
        lambda: (c := cluster.api.get("configmap", f"{NAME}-deploy-config-lastgood")) and
        c["data"]["config-hash"] == winner, message="the winner passed the gate")
    measured_once = {j["metadata"]["name"] for j in jobs(cluster)}
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"search": {
        "profiles": ["high-concurrency", "low-latency"]}}}})
    await cluster.wait_for(lambda: search_status(cluster).get("phase") == "Searching",
                           message="searching the new candidate")
    served: set[str] = set()

    async def decided() -> dict[str, Any] | None:
        status = (cluster.api.get_speech(NAME) or {})["status"]
        if status["profileSearch"]["phase"] == "Searching":
            served.add(status["configHash"])
        await asyncio.to_thread(play_jobs, cluster, script, [])
        found = search_status(cluster)
        return found if found.get("phase") == "Chosen" else None

    second = await cluster.wait_for(decided, timeout=60, interval=0.3, message="chosen again")
    assert served == {winner}  # no roll back to the spec's own profile meanwhile
    assert second["winner"] == "low-latency"
    assert {j["metadata"]["name"] for j in jobs(cluster)} - measured_once == {
        f"{NAME}-sweep-{second['winnerConfigHash']}", f"{NAME}-wer-{second['winnerConfigHash']}"}
    await cluster.wait_for(
        lambda: (cluster.api.get_speech(NAME) or {})["status"]["configHash"] ==
        second["winnerConfigHash"], message="the new winner serves")
