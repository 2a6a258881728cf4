"""The README's first command: the operator reconciling the example, printed for a newcomer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness.cluster import Cluster

from .journey import EXAMPLES

DEMO = [os.path.join(os.path.dirname(sys.executable), "minicpm-speech"), "demo"]


def run_demo(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run([*DEMO, *args], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_demo_on_the_embedded_emulator_prints_objects_and_status() -> None:
    done = run_demo()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "embedded Kubernetes API emulator" in done.stderr
    for row in ("ConfigMap    speech-deploy-config", "Deployment   speech", "Service      speech"):
        assert row in out
    assert "-- vllm serve openbmb/MiniCPM-o-4_5 --omni --deploy-config" in out
    assert "base_config: /opt/venv/lib/python3.12/site-packages/vllm_omni/deploy/" in out
    table = out.split("$ kubectl get minicpmspeech\n", 1)[1].splitlines()
    assert table[0].split()[:7] == ["NAME", "PROFILE", "PHASE", "READY", "REPLICAS",
                                    "AVAILABLE", "CONFIG"]
    assert table[1].split()[:6] == ["speech", "default", "Progressing", "False", "1", "0"]


def test_demo_yaml_output_is_every_object_in_full() -> None:
    done = run_demo("-o", "yaml")
    assert done.returncode == 0, done.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(done.stdout) if doc]
    assert kinds == ["ConfigMap", "Deployment", "Service", "MiniCPMSpeech"]


def test_demo_refuses_a_bad_manifest_before_touching_a_cluster(tmp_path: Path) -> None:
    manifest = yaml.safe_load((EXAMPLES / "minicpmspeech.yaml").read_text())
    manifest["spec"]["runtime"]["mps"]["activeThreadPercentage"] = 150
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(manifest))
    done = run_demo("-f", str(bad))
    assert done.returncode == 2
    assert "spec.runtime.mps.activeThreadPercentage: 150 is out of range" in done.stderr
    assert done.stdout == ""


def test_demo_targets_the_cluster_kubeconfig_names(cluster: Cluster, tmp_path: Path) -> None:
    manifest = yaml.safe_load((EXAMPLES / "minicpmspeech.yaml").read_text())
    manifest["metadata"]["namespace"] = cluster.namespace
    path = tmp_path / "speech.yaml"
    path.write_text(yaml.safe_dump(manifest))
    done = run_demo("-f", str(path), kubeconfig=cluster.kubeconfig_path)
    assert done.returncode == 0, done.stderr
    assert f"the cluster in {cluster.kubeconfig_path}" in done.stderr
    speech = cluster.api.get_speech("speech")
    assert speech is not None and speech["status"]["configHash"] in done.stdout
    assert cluster.api.get("deployment", "speech") is not None


def assert_one_line_refusal(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.startswith("minicpm-speech demo: ")
    for word in words:
        assert word in done.stderr


def test_demo_applies_a_multi_document_file_in_order() -> None:
    done = run_demo("-f", str(EXAMPLES / "hub-token.yaml"), "-o", "yaml")
    assert done.returncode == 0, done.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(done.stdout) if doc]
    assert kinds == ["ConfigMap", "Deployment", "Service", "MiniCPMSpeech"]
    speech = [doc for doc in yaml.safe_load_all(done.stdout) if doc][-1]
    assert speech["status"]["phase"] == "Progressing"


def test_demo_yaml_output_includes_the_perf_jobs_and_their_configmaps() -> None:
    done = run_demo("-f", str(EXAMPLES / "perf-gated.yaml"), "-o", "yaml")
    assert done.returncode == 0, done.stderr
    docs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    jobs = [doc["metadata"]["name"] for doc in docs if doc["kind"] == "Job"]
    assert jobs, "the perf Jobs are printed"
    for job in jobs:
        owned = [doc for doc in docs if doc["kind"] == "ConfigMap"
                 and doc["metadata"]["ownerReferences"][0]["name"] == job]
        assert owned, f"the ConfigMap of Job {job} is printed"


def test_demo_refuses_an_unknown_kind_naming_the_document(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text((EXAMPLES / "minicpmspeech.yaml").read_text()
                    + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    assert_one_line_refusal(run_demo("-f", str(path)), "document 2", "'Pod'")


def test_demo_refuses_a_deep_manifest_in_one_line(tmp_path: Path) -> None:
    text = (EXAMPLES / "minicpmspeech.yaml").read_text()
    path = tmp_path / "deep.yaml"
    path.write_text(text + "  profileOverrides: " + "[" * 500 + "]" * 500 + "\n")
    assert_one_line_refusal(run_demo("-f", str(path)), "max_depth", "32")


def test_demo_refuses_a_huge_override_in_one_line(tmp_path: Path) -> None:
    manifest = yaml.safe_load((EXAMPLES / "minicpmspeech.yaml").read_text())
    manifest["spec"]["profileOverrides"] = {"stages": [{"stage_id": 0, "x": "y" * 2_000_000}]}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(manifest))
    done = run_demo("-f", str(path))
    assert_one_line_refusal(done, "max_bytes", "262144")
    assert "yyyy" not in done.stderr


def test_demo_reports_a_resource_the_api_server_refuses_for_size(cluster: Cluster,
                                                                   tmp_path: Path) -> None:
    if not cluster.is_emulated:
        pytest.skip("the refusal is injected by the emulator")
    from minicpm_speech_emulator import Fault

    cluster.emulator.inject(Fault("POST", r"/minicpmspeeches$", status=413))  # type: ignore[union-attr]
    manifest = yaml.safe_load((EXAMPLES / "minicpmspeech.yaml").read_text())
    manifest["metadata"]["namespace"] = cluster.namespace
    path = tmp_path / "speech.yaml"
    path.write_text(yaml.safe_dump(manifest))
    done = run_demo("-f", str(path), kubeconfig=cluster.kubeconfig_path)
    # After the progress line and the operator's own log of its stop: one line, the reason.
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.splitlines()[-1]
    assert last.startswith("minicpm-speech demo: the API server refused MiniCPMSpeech speech "
                           "(413)"), done.stderr[-3000:]
