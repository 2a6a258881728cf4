"""The README's first command: the operator reconciling the example, printed for a newcomer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    assert table[0].split()[:5] == ["NAME", "PROFILE", "PHASE", "READY", "CONFIG"]
    assert table[1].split()[:4] == ["speech", "default", "Progressing", "False"]


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
