"""Steps of a benchmark journey: Jobs appear, and a test plays the Job controller and kubelet.

Completion is simulated the way a cluster reports it: the Job's pod, labelled job-name, with
a terminated container carrying the termination message (built with the Job program's own
builders), then the Job's status with its Complete or Failed condition and counts.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml
from minicpm_speech_perf.summarize import Point, sweep_message
from minicpm_speech_perf.wer import wer_message

from tests.harness.cluster import Cluster

from .journey import HASH_LABEL, NAME, example_spec

KIND_LABEL = "serving.minicpm-speech.io/perf-kind"
MERGE = "application/merge-patch+json"
STARTED, FINISHED = "2026-11-29T10:00:00Z", "2026-11-29T11:00:00Z"


def perf_spec(placement: str = "dedicated", **perf: Any) -> dict[str, Any]:
    spec = example_spec()
    spec["perf"] = {"enabled": True, "placement": placement, "concurrencies": [1, 8],
                    "datasetClaim": "seed-tts", "asrModelClaim": "whisper", **perf}
    return spec


def _json(response: Any) -> Any:
    return json.loads(response.data)


def jobs(cluster: Cluster, config_hash: str | None = None) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/component=perf"
    if config_hash:
        selector += f",{HASH_LABEL}={config_hash}"
    batch = kubernetes.client.BatchV1Api(cluster.api.client)
    items: list[dict[str, Any]] = _json(batch.list_namespaced_job(
        cluster.namespace, label_selector=selector, _preload_content=False))["items"]
    return sorted(items, key=lambda j: j["metadata"]["name"])


def job_of(cluster: Cluster, kind: str, config_hash: str) -> dict[str, Any] | None:
    found = [j for j in jobs(cluster, config_hash) if j["metadata"]["labels"][KIND_LABEL] == kind]
    return found[-1] if found else None


def program_config(cluster: Cluster, job: dict[str, Any]) -> dict[str, Any]:
    configmap = cluster.api.get("configmap", job["metadata"]["name"])
    assert configmap is not None, "the Job's config ConfigMap"
    config: dict[str, Any] = yaml.safe_load(configmap["data"]["config.yaml"])
    return config


def point(arm: str, c: int, tput: float, p95: float = 900.0) -> Point:
    return Point(arm, c, 4, tput, tput * 0.98, tput * 1.02, p95 * 0.6, p95 * 0.5, p95 * 0.7,
                 p95, 0.2, tput / 4, 256, 256, 40960.0)


def sweep_result(config_hash: str, tput: dict[int, float], *, baseline: dict[int, float] | None
                 = None, mode: str = "dedicated") -> str:
    arms = [("B" if mode != "live" else "live", tput)]
    if baseline is not None:
        arms.insert(0, ("A", baseline))
    points = [point(arm, c, value) for arm, values in arms for c, value in sorted(values.items())]
    header = {"config_hash": config_hash, "mode": mode, "started": STARTED, "finished": FINISHED,
              "baseline": "A" if baseline is not None else None}
    return sweep_message(header, points)


SIM_MODEL, MOS_MODEL = "resemblyzer-0.1.4", "distillmos-0.9.1"


def wer_result(config_hash: str, wer: float, mode: str = "dedicated", *, sim: float = 0.72,
               mos: float = 3.9) -> str:
    """A quality Job's result; ``sim`` and ``mos`` as its speaker and naturalness models
    measured them."""
    rows = [{"concurrency": c, "wer": wer, "completed": 64, "judged": 64, "total": 64,
             "sim": sim, "sim_p10": sim - 0.05, "sim_n": 64, "mos": mos, "mos_p10": mos - 0.3,
             "mos_n": 64, "rescored": wer, "rescored_judged": 64} for c in (8, 1)]
    return wer_message({"config_hash": config_hash, "mode": mode, "started": STARTED,
                        "finished": FINISHED, "status": "ok", "reason": "", "rows": rows,
                        "sim_model": SIM_MODEL, "mos_model": MOS_MODEL})


def spoken_quality_result(workdir: Path, config_hash: str, *, other_voice: bool) -> str:
    """What the quality program itself leaves when the server it measures speaks in the
    reference prompts' voice, or in another one (espeak-ng): the real run, scored by the real
    speaker and naturalness models (tests/perf/spoken_quality.py)."""
    perf_tests = str(Path(__file__).resolve().parents[1] / "perf")
    if perf_tests not in sys.path:  # its helpers import each other as top-level modules
        sys.path.insert(0, perf_tests)
    from spoken_quality import OTHER_VOICE, REFERENCE_VOICE, spoken_quality_message

    voice = OTHER_VOICE if other_voice else REFERENCE_VOICE
    rc, message = spoken_quality_message(workdir, voice, config_hash=config_hash)
    assert rc == 0, message
    return message


def finish(cluster: Cluster, job: dict[str, Any], message: str | None, *, failed: bool = False,
           job_reason: str = "BackoffLimitExceeded", pod_reason: str | None = None) -> None:
    """Its pod ends (with ``message`` in the termination log), then the Job reports it."""
    name, uid = job["metadata"]["name"], job["metadata"]["uid"]
    core = kubernetes.client.CoreV1Api(cluster.api.client)
    batch = kubernetes.client.BatchV1Api(cluster.api.client)
    pod = {"metadata": {"name": f"{name}-pod", "labels": {
        "job-name": name, "batch.kubernetes.io/job-name": name},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                             "controller": True}]},
           "spec": copy.deepcopy(job["spec"]["template"]["spec"])}
    core.create_namespaced_pod(cluster.namespace, pod, _preload_content=False)
    terminated: dict[str, Any] = {"exitCode": 1 if failed else 0,
                                  "reason": "Error" if failed else "Completed"}
    if message is not None:
        terminated["message"] = message
    status: dict[str, Any] = {"phase": "Failed" if failed else "Succeeded", "containerStatuses": [
        {"name": "perf", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
         "state": {"terminated": terminated}}]}
    if pod_reason:
        status["reason"] = pod_reason
    core.patch_namespaced_pod_status(f"{name}-pod", cluster.namespace, {"status": status},
                                     _content_type=MERGE, _preload_content=False)
    condition = {"type": "Failed" if failed else "Complete", "status": "True",
                 "lastTransitionTime": FINISHED, **({"reason": job_reason} if failed else {})}
    job_status: dict[str, Any] = {"startTime": STARTED, "conditions": [condition],
                                  "failed" if failed else "succeeded": 1}
    if not failed:
        job_status["completionTime"] = FINISHED
    batch.patch_namespaced_job_status(name, cluster.namespace, {"status": job_status},
                                      _content_type=MERGE, _preload_content=False)


def perf_status(cluster: Cluster, name: str = NAME) -> dict[str, Any]:
    speech = cluster.api.get_speech(name) or {}
    perf: dict[str, Any] = (speech.get("status") or {}).get("perf") or {}
    return perf
