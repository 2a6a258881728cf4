"""Each command's help works with only what it needs installed, and a missing or dead cluster
is one line naming the problem and the fix, not a traceback or a minute of retries."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
PERF_EXTRA = ["numpy", "matplotlib", "jiwer", "zhon", "faster_whisper", "pynvml"]


def run(*argv: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          env=env if env is not None else dict(os.environ))


def test_perf_jobs_help_works_without_the_perf_extra() -> None:
    # The extra's modules made unimportable, as in an environment without `perf`.
    code = (f"import sys; sys.modules.update(dict.fromkeys({PERF_EXTRA!r})); "
            "from minicpm_speech_perf.cli import main; sys.exit(main(['--help']))")
    done = run(sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    assert "usage: perf-jobs" in done.stdout and "Traceback" not in done.stderr


def test_runtime_help_prints_help() -> None:
    for argv in (["--help"], ["-h"], ["serve", "--help"]):
        done = run(str(BIN / "minicpm-speech-runtime"), *argv)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("usage: minicpm-speech-runtime serve")
        assert "--health-port" in done.stdout and done.stderr == ""


def operator_with(kubeconfig: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("KUBERNETES_SERVICE_HOST",)}
    env["KUBECONFIG"] = str(kubeconfig)
    started = time.monotonic()
    done = run(str(BIN / "minicpm-speech"), "operator", "--namespace", "x",
               "--metrics-port", "0", "--health-port", "0", env=env, timeout=30)
    return done, time.monotonic() - started


def test_operator_with_a_missing_kubeconfig_says_so_in_one_line(tmp_path: Path) -> None:
    done, took = operator_with(tmp_path / "absent")
    assert done.returncode != 0 and took < 10
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"KUBECONFIG={tmp_path / 'absent'} names no file" in done.stderr
    assert "Fix:" in done.stderr


def test_operator_with_a_dead_api_server_says_so_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n")
    done, took = operator_with(path)
    assert done.returncode != 0 and took < 10
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "API server at http://127.0.0.1:1" in done.stderr and "does not answer" in done.stderr
    assert "Fix:" in done.stderr
