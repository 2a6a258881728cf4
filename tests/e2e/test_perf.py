"""Benchmark Jobs on every serving-config change, their results in status, and the gate."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from minicpm_speech_contract.termination import parse_termination_message

from tests.harness.cluster import Cluster
from tests.harness.kopf_runner import Operator

from .journey import (
    HASH_LABEL,
    NAME,
    children,
    condition,
    create_and_settle,
    event_reasons,
    events,
    mark_rolled_out,
    settled,
)
from .perf_journey import (
    MOS_MODEL,
    SIM_MODEL,
    finish,
    job_of,
    jobs,
    perf_spec,
    perf_status,
    program_config,
    spoken_quality_result,
    sweep_result,
    wer_result,
)

pytestmark = pytest.mark.usefixtures("emulated_only")


@pytest.fixture
def emulated_only(cluster: Cluster) -> None:
    if not cluster.is_emulated:
        pytest.skip("completion is simulated by writing Job and pod status")


def kinds(found: list[dict[str, Any]]) -> list[str]:
    return sorted(j["metadata"]["labels"]["serving.minicpm-speech.io/perf-kind"] for j in found)


async def both_jobs(cluster: Cluster, config_hash: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = await cluster.wait_for(
        lambda: (j := jobs(cluster, config_hash)) and len(j) == 2 and j,
        message=f"sweep and WER Jobs of {config_hash}")
    return found


async def complete(cluster: Cluster, config_hash: str, tput: float = 20.0, wer: float = 0.03,
                   baseline: float | None = None, sim: float = 0.72) -> None:
    sweep, quality = job_of(cluster, "sweep", config_hash), job_of(cluster, "wer", config_hash)
    assert sweep is not None and quality is not None
    finish(cluster, sweep, sweep_result(config_hash, {1: tput / 3, 8: tput}, baseline=None
                                        if baseline is None else {1: baseline / 3, 8: baseline}))
    finish(cluster, quality, wer_result(config_hash, wer, sim=sim))


async def test_a_profile_change_creates_one_sweep_and_one_wer_job_for_the_new_hash(
        cluster: Cluster, operator: Operator) -> None:
    first = (await create_and_settle(cluster, perf_spec()))["status"]["configHash"]
    old = await both_jobs(cluster, first)
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "low-latency"}}})
    second = (await cluster.wait_for(
        lambda: (s := settled(cluster)()) and s["status"]["configHash"] != first and s)
    )["status"]["configHash"]
    new = await both_jobs(cluster, second)
    assert kinds(new) == ["sweep", "wer"]
    names = [j["metadata"]["name"] for j in new]
    assert names == [f"{NAME}-sweep-{second}", f"{NAME}-wer-{second}"]
    for job in new:
        assert job["metadata"]["ownerReferences"][0]["kind"] == "MiniCPMSpeech"
        assert job["metadata"]["labels"][HASH_LABEL] == second
        pod = job["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in ("1", 1)
    # The running Jobs of the first hash are superseded, and that is said.
    await cluster.wait_for(lambda: not jobs(cluster, first), message="old Jobs deleted")
    assert {j["metadata"]["name"] for j in old}.isdisjoint(j["metadata"]["name"]
                                                          for j in jobs(cluster))
    await cluster.wait_for(lambda: "JobDeleted" in event_reasons(cluster))
    config = program_config(cluster, new[0])
    assert config["config_hash"] == second and config["mode"] == "dedicated"
    (arm,) = config["arms"]  # no last good yet: one arm, no ABBA
    assert arm["command"][:2] == ["minicpm-speech-runtime", "serve"]
    assert arm["command"][arm["command"].index("--deploy-config") + 1] == \
        "/etc/perf/candidate.yaml"
    # Reconciling again, and restarting, never duplicates a Job.
    await operator.restart()
    await cluster.wait_for(settled(cluster))
    assert len(jobs(cluster)) == 2


async def test_results_land_in_status_and_become_the_last_good(cluster: Cluster,
                                                               operator: Operator) -> None:
    config_hash = (await create_and_settle(cluster, perf_spec()))["status"]["configHash"]
    await both_jobs(cluster, config_hash)
    assert perf_status(cluster)["phase"] in ("Pending", "Running")
    await complete(cluster, config_hash, tput=24.5, wer=0.031)
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and
        condition(s, "Benchmarked").get("status") == "True" and s)
    perf = speech["status"]["perf"]
    assert perf["configHash"] == config_hash and perf["phase"] == "Succeeded"
    assert perf["headline"] == {"concurrency": 8, "audioThroughput": 24.5,
                                "firstAudioMs": 540.0, "firstAudioP95Ms": 900.0}
    assert perf["quality"]["werPercent"] == 3.1 and perf["quality"]["judged"] == 64
    assert [p["concurrency"] for p in perf["points"]] == [1, 8]
    assert perf["finishedAt"] == "2026-11-29T11:00:00Z"
    assert condition(speech, "PerfGate")["reason"] == "NoBaseline"
    assert condition(speech, "QualityGate")["status"] == "True"
    assert condition(speech, "Benchmarked")["message"] == (
        "24.5 audio-s/s at C8, WER 3.1 %, SIM 0.72, MOS 3.9 at C8")
    assert perf["quality"]["sim"] == 0.72 and perf["quality"]["mos"] == 3.9
    assert perf["quality"]["simModel"] == SIM_MODEL and perf["quality"]["mosModel"] == MOS_MODEL
    assert perf["werPoints"][0]["simP10"] == 0.67 and perf["werPoints"][0]["mosScored"] == 64
    await cluster.wait_for(lambda: "Benchmarked" in event_reasons(cluster))
    last_good = await cluster.wait_for(
        lambda: cluster.api.get("configmap", f"{NAME}-deploy-config-lastgood"))
    assert last_good["data"]["config-hash"] == config_hash
    await cluster.wait_for(lambda: perf_status(cluster).get("lastGood", {}).get("configHash")
                           == config_hash, message="lastGood in status")


async def test_a_failed_gate_rolls_back_to_the_last_good_config(cluster: Cluster,
                                                               operator: Operator) -> None:
    good = (await create_and_settle(cluster, perf_spec(rollback=True)))["status"]["configHash"]
    await both_jobs(cluster, good)
    await complete(cluster, good, tput=25.0)
    good_config = await cluster.wait_for(
        lambda: (c := cluster.api.get("configmap", f"{NAME}-deploy-config-lastgood")) and c)
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "low-latency"}}})
    bad = (await cluster.wait_for(
        lambda: (s := settled(cluster)()) and s["status"]["configHash"] != good and s)
    )["status"]["configHash"]
    await both_jobs(cluster, bad)
    sweep = job_of(cluster, "sweep", bad)
    assert sweep is not None
    config = program_config(cluster, sweep)
    assert [arm["name"] for arm in config["arms"]] == ["A", "B"]  # ABBA against the last good
    baseline_cm = cluster.api.get("configmap", sweep["metadata"]["name"])
    assert baseline_cm is not None
    assert baseline_cm["data"]["baseline.yaml"] == good_config["data"]["deploy-config.yaml"]
    # 20 % less audio throughput than the baseline arm measured in the same Job.
    await complete(cluster, bad, tput=20.0, baseline=25.0)
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and
        condition(s, "RolledBack").get("status") == "True" and s, message="rolled back")
    assert condition(speech, "PerfGate")["status"] == "False"
    assert "-20.0 %" in condition(speech, "PerfGate")["message"]
    assert condition(speech, "QualityGate")["status"] == "True"
    assert condition(speech, "Degraded")["reason"] == "GateFailed"
    status = speech["status"]
    assert status["configHash"] == good  # what serves
    assert status["perf"]["configHash"] == bad  # what was measured
    assert status["perf"]["rolledBack"] == {"fromHash": bad, "toHash": good}

    def restored() -> bool:
        current = children(cluster)
        deployment, configmap = current["deployment"], current["configmap"]
        return bool(deployment and configmap
                    and deployment["spec"]["template"]["metadata"]["annotations"][HASH_LABEL]
                    == good
                    and configmap["data"]["deploy-config.yaml"]
                    == good_config["data"]["deploy-config.yaml"])

    await cluster.wait_for(restored, message="Deployment and ConfigMap back to the last good")
    assert cluster.api.get_speech(NAME)["spec"]["profile"]["name"] == "low-latency"  # type: ignore[index]


async def test_a_config_that_changes_the_speaker_fails_sim_and_rolls_back(
        cluster: Cluster, operator: Operator, tmp_path: Path) -> None:
    """Words right, voice wrong: the new config's server answers in another voice, its WER
    is the same and its throughput better, but only SIM sees that its speech no longer
    sounds like the reference. Both quality results are the quality program's own, run on
    espeak-ng speech with the real models."""
    good = (await create_and_settle(cluster, perf_spec(rollback=True)))["status"]["configHash"]
    await both_jobs(cluster, good)
    good_result = await asyncio.to_thread(spoken_quality_result, tmp_path / "good", good,
                                          other_voice=False)
    finish(cluster, job_of(cluster, "sweep", good), sweep_result(good, {1: 8.0, 8: 25.0}))
    finish(cluster, job_of(cluster, "wer", good), good_result)
    await cluster.wait_for(lambda: cluster.api.get("configmap", f"{NAME}-deploy-config-lastgood"))
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "low-latency"}}})
    bad = (await cluster.wait_for(
        lambda: (s := settled(cluster)()) and s["status"]["configHash"] != good and s)
    )["status"]["configHash"]
    await both_jobs(cluster, bad)
    bad_result = await asyncio.to_thread(spoken_quality_result, tmp_path / "bad", bad,
                                         other_voice=True)
    finish(cluster, job_of(cluster, "sweep", bad),
           sweep_result(bad, {1: 8.7, 8: 26.0}, baseline={1: 8.3, 8: 25.0}))
    finish(cluster, job_of(cluster, "wer", bad), bad_result)
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and
        condition(s, "RolledBack").get("status") == "True" and s, message="rolled back")
    assert condition(speech, "PerfGate")["status"] == "True"
    quality_gate = condition(speech, "QualityGate")
    assert quality_gate["status"] == "False"
    assert "C8: SIM" in quality_gate["message"] and f"last good {good}" in quality_gate["message"]
    assert "WER" not in quality_gate["message"]  # the words were right
    good_sim = parse_termination_message(good_result)["wer"][0]["sim"]
    quality = speech["status"]["perf"]["quality"]
    assert quality["sim"] < good_sim - 0.05 and quality["simModel"].startswith("resemblyzer")
    assert speech["status"]["configHash"] == good
    assert "SIM" in condition(speech, "Benchmarked")["message"]  # all three in kubectl describe


async def test_maintenance_scales_serving_to_zero_and_restores_it(cluster: Cluster,
                                                                 operator: Operator) -> None:
    spec = {**perf_spec("maintenance"), "replicas": 2}
    config_hash = (await create_and_settle(cluster, spec))["status"]["configHash"]
    sweep = await cluster.wait_for(lambda: job_of(cluster, "sweep", config_hash))

    def scaled(replicas: int) -> Any:
        return lambda: (d := cluster.api.get("deployment", NAME)) and \
            d["spec"]["replicas"] == replicas and d

    await cluster.wait_for(scaled(0), message="scaled to zero")
    speech = cluster.api.get_speech(NAME)
    assert condition(speech, "Maintenance")["status"] == "True"
    assert speech["status"]["perf"]["maintenance"] == {"active": True, "restoreReplicas": 2}
    assert speech["spec"]["replicas"] == 2  # type: ignore[index]
    assert job_of(cluster, "wer", config_hash) is None  # one GPU: the sweep goes first
    assert program_config(cluster, sweep)["mode"] == "maintenance"
    # A restart in the middle keeps the window open, and the user's count.
    await operator.restart()
    finish(cluster, sweep, sweep_result(config_hash, {1: 8.0, 8: 24.0}, mode="maintenance"))
    quality = await cluster.wait_for(lambda: job_of(cluster, "wer", config_hash))
    assert cluster.api.get("deployment", NAME)["spec"]["replicas"] == 0  # type: ignore[index]
    finish(cluster, quality, wer_result(config_hash, 0.03, mode="maintenance"))
    await cluster.wait_for(scaled(2), message="serving restored")
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and
        condition(s, "Maintenance").get("status") == "False" and s)
    assert condition(speech, "Benchmarked")["status"] == "True"


async def test_live_mode_measures_the_service_without_a_fresh_server(cluster: Cluster,
                                                                     operator: Operator) -> None:
    config_hash = (await create_and_settle(cluster, perf_spec("live")))["status"]["configHash"]
    await cluster.wait_for(lambda: "waiting until every replica" in perf_status(cluster).get(
        "message", ""), message="waits for the rollout")
    assert jobs(cluster) == []
    await mark_rolled_out(cluster)
    sweep = await cluster.wait_for(lambda: job_of(cluster, "sweep", config_hash))
    config = program_config(cluster, sweep)
    assert config["mode"] == "live" and config["arms"] == [{"name": "live"}]
    assert config["client"]["base_url"] == f"http://{NAME}.{cluster.namespace}.svc:8091"
    configmap = cluster.api.get("configmap", sweep["metadata"]["name"])
    assert configmap is not None and set(configmap["data"]) == {"config.yaml"}
    container = sweep["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert perf_status(cluster)["placement"] == "live"


async def test_a_malformed_result_is_a_condition_and_retries_are_bounded(
        cluster: Cluster, operator: Operator) -> None:
    spec = perf_spec(job={"maxAttempts": 2})
    config_hash = (await create_and_settle(cluster, spec))["status"]["configHash"]
    await both_jobs(cluster, config_hash)
    sweep = job_of(cluster, "sweep", config_hash)
    assert sweep is not None
    finish(cluster, sweep, "{not json")
    retry = await cluster.wait_for(
        lambda: (j := job_of(cluster, "sweep", config_hash)) and
        j["metadata"]["name"].endswith("-2") and j, message="second attempt")
    await cluster.wait_for(lambda: perf_status(cluster)["sweep"].get("attempt") == 2,
                           message="the count is visible")
    assert perf_status(cluster)["sweep"]["maxAttempts"] == 2
    await cluster.wait_for(lambda: any(
        e["reason"] == "BenchmarkRetried" and "MalformedResult" in e["message"]
        for e in events(cluster)), message="the reason is told")
    finish(cluster, retry, None, failed=True, job_reason="DeadlineExceeded")
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and
        condition(s, "Benchmarked").get("reason") == "DeadlineExceeded" and s)
    assert speech["status"]["perf"]["sweep"]["state"] == "Failed"
    assert condition(speech, "PerfGate")["status"] == "Unknown"
    assert "headline" not in speech["status"]["perf"]  # never a result that is not there
    await cluster.wait_for(settled(cluster))
    assert len([j for j in jobs(cluster, config_hash)
                if j["metadata"]["labels"]["serving.minicpm-speech.io/perf-kind"] == "sweep"]) == 2
