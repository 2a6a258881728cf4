"""The sweep orchestrator against a real loopback HTTP server process and a fake client.

The server stands in for `vllm serve` (slow to become ready, stops on SIGTERM); the client
stands in for `vllm bench serve --omni` (parses the protocol flags, writes an official-format
result). Both log events to one file, which proves order, readiness and clean stops.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_env import FAKES, FixedSampler, free_port, read_events, server_cmd
from minicpm_speech_contract.termination import parse_termination_message
from minicpm_speech_perf.config import ConfigError, SweepConfig, parse_sweep
from minicpm_speech_perf.gpumem import NvmlSampler
from minicpm_speech_perf.procs import SubprocessRunner
from minicpm_speech_perf.sweep import finish_sweep, run_sweep


def config(tmp_path: Path, arms: list[dict[str, Any]], **over: Any) -> SweepConfig:
    port = over.pop("port")
    data: dict[str, Any] = {
        "mode": "dedicated",
        "config_hash": "cfg-42",
        "artifacts_dir": str(tmp_path / "artifacts"),
        "termination_log": str(tmp_path / "termination-log"),
        "arms": arms,
        "concurrencies": [1, 8],
        "client": {
            "model": "openbmb/MiniCPM-o-4_5",
            "tokenizer": "/models/MiniCPM-o-4_5",
            "dataset_root": "/data/seed-tts-64",
            "command_prefix": [sys.executable, str(FAKES / "fake_client.py")],
            "run_timeout_s": 30,
        },
        "server": {"port": port, "ready_timeout_s": 20, "stop_grace_s": 5, "poll_s": 0.1},
    }
    for key, value in over.items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    return parse_sweep(data)


@pytest.fixture
def events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv("FAKE_EVENTS", str(path))
    return path


def test_abba_sweep_order_readiness_and_clean_stops(tmp_path: Path, events: Path) -> None:
    port = free_port()
    arms = [
        {"name": "A", "command": server_cmd(events, port, "A", "--ready-after", "0.6")},
        {"name": "B", "command": server_cmd(events, port, "B", "--ready-after", "0.3")},
    ]
    cfg = config(tmp_path, arms, port=port)
    manifest = run_sweep(cfg, SubprocessRunner(), lambda: FixedSampler(71234.5))
    assert manifest["status"] == "ok", manifest["reason"]
    ev = read_events(events)

    # Servers: A, B, B, A; each started, became ready, got SIGTERM and exited, in turn.
    server_ev = [(e["name"], e["event"]) for e in ev if e["who"] == "server"]
    life = ["start", "ready", "sigterm", "exit"]
    assert server_ev == [(n, k) for n in ("A", "B", "B", "A") for k in life]

    # Clients ran only between a server's readiness and its SIGTERM, in plan order.
    visits: list[list[str]] = []
    for e in ev:
        if e["who"] == "server" and e["event"] == "ready":
            visits.append([])
        elif e["who"] == "client":
            assert e["server_up"]
            visits[-1].append(e["name"])
    expected = ["warmup", "c1-discard", "c1-measured1", "c1-measured2",
                "c8-discard", "c8-measured1", "c8-measured2"]  # fmt: skip
    for label, names in zip(("A.1", "B.1", "B.2", "A.2"), visits, strict=True):
        assert names == [f"{label}-{s}.json" for s in expected]
    warmups = [e for e in ev if e["who"] == "client" and "warmup" in e["name"]]
    assert all((e["c"], e["n"]) == (16, 16) for e in warmups)
    assert all(e["env"]["SEED_TTS_WER_EVAL"] == "0" for e in ev if e["who"] == "client")

    # Readiness was waited for: the first run came after the slow server said ready.
    first = manifest["visits"][0]
    assert first["ready_after_s"] >= 0.5
    assert [v["server_exit_code"] for v in manifest["visits"]] == [0, 0, 0, 0]
    measured = [r for v in manifest["visits"] for r in v["runs"] if r["kind"] == "measured"]
    assert len(measured) == 16
    assert all(r["gpu_memory"]["peak_mib"] == 71234.5 for r in measured)
    assert all("gpu_memory" not in r for v in manifest["visits"] for r in v["runs"]
               if r["kind"] != "measured")  # fmt: skip

    rc, message = finish_sweep(cfg, manifest)
    assert rc == 0
    msg = parse_termination_message((tmp_path / "termination-log").read_text())
    assert msg == parse_termination_message(message)
    assert msg["hash"] == "cfg-42" and msg["baseline"] == "A" and msg["status"] == "ok"
    assert [(p["arm"], p["c"]) for p in msg["points"]] == [("A", 1), ("A", 8), ("B", 1), ("B", 8)]
    assert all(p["mem_mib"] == 71234.5 and p["n"] == 256 for p in msg["points"])
    for name in ("summary.json", "summary.md", "throughput.png", "first_audio_latency.png"):
        assert (cfg.artifacts_dir / name).is_file()


def test_full_protocol_plan_single_arm(tmp_path: Path, events: Path) -> None:
    port = free_port()
    cfg = config(tmp_path, [{"name": "cand", "command": server_cmd(events, port, "c")}],
                 port=port, concurrencies=[1, 2, 4, 8, 16, 32])  # fmt: skip
    manifest = run_sweep(cfg, SubprocessRunner(), lambda: FixedSampler(1.0))
    assert manifest["status"] == "ok"
    runs = manifest["visits"][0]["runs"]
    assert len(manifest["visits"]) == 1 and len(runs) == 19
    assert [r["concurrency"] for r in runs] == [16] + [c for c in (1, 2, 4, 8, 16, 32)
                                                      for _ in range(3)]  # fmt: skip
    assert finish_sweep(cfg, manifest)[0] == 0


def test_request_counts_from_config_shape_every_run(tmp_path: Path, events: Path) -> None:
    """Smaller counts (a CPU machine's whole-path test) reach the client's argv and the
    manifest says they are not the protocol's; the summary still parses every run."""
    port = free_port()
    cfg = config(tmp_path, [{"name": "cpu", "command": server_cmd(events, port, "c")}],
                 port=port, concurrencies=[1, 2],
                 requests={"measured": 3, "warmup": 2, "repeats": 1})  # fmt: skip
    manifest = run_sweep(cfg, SubprocessRunner(), lambda: FixedSampler(1.0))
    assert manifest["status"] == "ok", manifest["reason"]
    assert manifest["requests"] == {"measured": 3, "warmup": 2, "repeats": 1, "protocol": False}
    runs = manifest["visits"][0]["runs"]
    assert [(r["kind"], r["concurrency"], r["num_prompts"]) for r in runs] == [
        ("warmup", 16, 2), ("discard", 1, 3), ("measured", 1, 3),
        ("discard", 2, 3), ("measured", 2, 3)]  # fmt: skip
    for run in runs:
        argv = run["argv"]
        assert argv[argv.index("--num-prompts") + 1] == str(run["num_prompts"])
    rc, message = finish_sweep(cfg, manifest)
    assert rc == 0
    assert [(p["c"], p["n"]) for p in parse_termination_message(message)["points"]] == [
        (1, 3), (2, 3)]
    assert config(tmp_path, [{"name": "A", "command": ["x"]}], port=port).counts.is_protocol


def test_server_ignoring_sigterm_is_killed_after_grace(tmp_path: Path, events: Path) -> None:
    port = free_port()
    cmd = server_cmd(events, port, "stubborn", "--ignore-sigterm")
    cfg = config(tmp_path, [{"name": "A", "command": cmd}], port=port, concurrencies=[1],
                 server={"stop_grace_s": 0.5})  # fmt: skip
    manifest = run_sweep(cfg, SubprocessRunner(), lambda: FixedSampler(1.0))
    stopped = time.time()
    assert manifest["status"] == "ok"
    assert manifest["visits"][0]["server_exit_code"] == -9
    server = [e for e in read_events(events) if e["who"] == "server"]
    assert server[-1]["event"] == "sigterm" and "exit" not in {e["event"] for e in server}
    # killed after the 0.5 s grace, far inside the 60 s default it would otherwise wait
    assert stopped - server[-1]["t"] < 20


def test_readiness_timeout_fails_and_stops_the_server(tmp_path: Path, events: Path) -> None:
    port = free_port()
    cmd = server_cmd(events, port, "slow", "--ready-after", "60")
    cfg = config(tmp_path, [{"name": "A", "command": cmd}], port=port, concurrencies=[1],
                 server={"ready_timeout_s": 1.0})  # fmt: skip
    manifest = run_sweep(cfg, SubprocessRunner(), lambda: FixedSampler(1.0))
    assert manifest["status"] == "failed"
    assert "not ready" in manifest["reason"] and "server-A1.log" in manifest["reason"]
    assert manifest["visits"][0]["server_exit_code"] == 0
    assert not [e for e in read_events(events) if e["who"] == "client"]
    rc, message = finish_sweep(cfg, manifest)
    msg = parse_termination_message(message)
    assert rc == 1 and msg["status"] == "failed" and "not ready" in msg["reason"]
    assert msg["points"] == []


def test_server_dying_before_ready_is_reported(tmp_path: Path, events: Path) -> None:
    port = free_port()
    cmd = server_cmd(events, port, "crash", "--ready-after", "60", "--die-after", "0.3")
    cfg = config(tmp_path, [{"name": "A", "command": cmd}], port=port, concurrencies=[1])
    manifest = run_sweep(cfg, SubprocessRunner(), lambda: FixedSampler(1.0))
    assert manifest["status"] == "failed"
    assert "exited with code 7 before it was ready" in manifest["reason"]


def test_client_timeout_and_failure_abort_the_sweep(
    tmp_path: Path, events: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    arms = [{"name": "A", "command": server_cmd(events, port, "A")}]
    monkeypatch.setenv("FAKE_CLIENT_SLEEP", "30")
    cfg = config(tmp_path / "t", arms, port=port, concurrencies=[1], client={"run_timeout_s": 1})
    manifest = run_sweep(cfg, SubprocessRunner(), lambda: FixedSampler(1.0))
    assert manifest["status"] == "failed" and "exceeded 1 s" in manifest["reason"]
    assert manifest["visits"][0]["server_exit_code"] == 0

    monkeypatch.setenv("FAKE_CLIENT_SLEEP", "0")
    monkeypatch.setenv("FAKE_CLIENT_FAIL_ON", "A.1-c1-measured1.json")
    cfg = config(tmp_path / "f", arms, port=port, concurrencies=[1])
    manifest = run_sweep(cfg, SubprocessRunner(), lambda: FixedSampler(1.0))
    assert manifest["status"] == "failed"
    assert manifest["reason"].startswith("A.1-c1-measured1: client exited with code 3")
    done = [r["name"] for r in manifest["visits"][0]["runs"]]
    assert done == ["A.1-warmup", "A.1-c1-discard"]


def test_port_already_serving_is_refused(tmp_path: Path, events: Path) -> None:
    port = free_port()
    stale = subprocess.Popen(server_cmd(events, port, "stale"))
    try:
        _wait_port(port)
        cfg = config(tmp_path, [{"name": "A", "command": server_cmd(events, port, "A")}],
                     port=port, concurrencies=[1])  # fmt: skip
        manifest = run_sweep(cfg, SubprocessRunner(), lambda: FixedSampler(1.0))
        assert manifest["status"] == "failed" and "already answers" in manifest["reason"]
    finally:
        stale.terminate()
        stale.wait(10)


def test_live_mode_starts_no_server(tmp_path: Path, events: Path) -> None:
    port = free_port()
    service = subprocess.Popen(server_cmd(events, port, "service"))
    try:
        _wait_port(port)
        cfg = config(tmp_path, [{"name": "live"}], port=port, mode="live", concurrencies=[2],
                     client={"base_url": f"http://127.0.0.1:{port}"})  # fmt: skip
        manifest = run_sweep(cfg, SubprocessRunner(), lambda: FixedSampler(1.0))
        assert manifest["status"] == "ok"
        assert len(manifest["visits"]) == 1 and not manifest["visits"][0]["fresh_server"]
        starts = [e for e in read_events(events) if e.get("event") == "start"]
        assert [e["name"] for e in starts] == ["service"]
        rc, message = finish_sweep(cfg, manifest)
        msg = parse_termination_message(message)
        assert rc == 0 and msg["mode"] == "live" and msg["baseline"] is None
    finally:
        service.terminate()
        service.wait(10)


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("fake server did not listen")


def test_nvml_absent_is_recorded_not_faked(monkeypatch: pytest.MonkeyPatch) -> None:
    import minicpm_speech_perf.gpumem as gpumem

    def no_nvml() -> Any:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpumem, "_load_nvml", no_nvml)
    with NvmlSampler() as s:
        pass
    r = s.reading()
    assert (r.available, r.peak_mib) == (False, None)
    assert "pynvml" in r.reason


def test_nvml_without_driver_is_recorded_not_faked() -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU driver is present")
    with NvmlSampler() as s:
        pass
    assert s.reading().available is False and s.reading().reason


def test_nvml_peak_is_the_largest_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    import minicpm_speech_perf.gpumem as gpumem

    sampled_thrice = threading.Event()  # the entry sample and two from the sampling thread

    class FakeNvml:
        used = iter([1, 5, 3] + [2] * 1000)
        calls = 0

        def nvmlInit(self) -> None: ...

        def nvmlShutdown(self) -> None: ...

        def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
            return i

        def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
            FakeNvml.calls += 1
            if FakeNvml.calls == 3:
                sampled_thrice.set()
            return type("Info", (), {"used": next(self.used) * 1024 * 1024})()

    monkeypatch.setattr(gpumem, "_load_nvml", FakeNvml)
    with NvmlSampler(interval_s=0.01) as s:
        assert sampled_thrice.wait(10), "the sampling thread never sampled"
    r = s.reading()
    assert r.available and r.peak_mib == 5.0 and r.samples >= 3


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"mode": "cluster"}, "mode"),
        ({"config_hash": "a b"}, "config_hash"),
        ({"arms": []}, "arms"),
        ({"arms": [{"name": "A"}]}, "arms[0].command"),
        ({"arms": [{"name": "A", "command": ["x"], "typo": 1}]}, "arms[0].typo"),
        ({"arms": [{"name": "A", "command": ["x"], "env": {"1X": "y"}}]}, "arms[0].env"),
        ({"concurrencies": [3]}, "concurrencies"),
        ({"concurrencies": "1,2"}, "concurrencies"),
        ({"client": {"model": ""}}, "client.model"),
        ({"server": {"port": 0}}, "server.port"),
        ({"server": {"ready_path": "health"}}, "server.ready_path"),
        ({"mode": "live", "arms": [{"name": "L"}]}, "client.base_url"),
        ({"mode": "live", "arms": [{"name": "L", "command": ["x"]}]}, "arms[0].command"),
        ({"extra": 1}, "extra"),
        ({"requests": {"measured": 65}}, "requests.measured"),
        ({"requests": {"warmup": 0}}, "requests.warmup"),
        ({"requests": {"repeats": 9}}, "requests.repeats"),
        ({"requests": {"measured": "4"}}, "requests.measured"),
        ({"requests": {"rows": 4}}, "requests.rows"),
        ({"requests": [4]}, "requests"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, change: dict[str, Any], needle: str) -> None:
    arms = [{"name": "A", "command": ["serve"]}]
    kwargs: dict[str, Any] = {"port": 8091, **change}
    if "arms" in kwargs:
        arms = kwargs.pop("arms")
    with pytest.raises(ConfigError) as err:
        config(tmp_path, arms, **kwargs)
    assert str(err.value).startswith(needle) or needle in str(err.value)


def test_cli_bad_config_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from minicpm_speech_perf.cli import main

    cfg = tmp_path / "sweep.yaml"
    cfg.write_text("mode: dedicated\nconfig_hash: abc\narms: [{name: A}]\n")
    assert main(["sweep", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "arms[0].command" in err
    assert main(["sweep", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    cfg.write_text("{not: [valid")
    assert main(["sweep", "--config", str(cfg)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_cli_sweep_end_to_end(tmp_path: Path, events: Path) -> None:
    port = free_port()
    data = {
        "config_hash": "e2e",
        "artifacts_dir": str(tmp_path / "art"),
        "arms": [{"name": "A", "command": server_cmd(events, port, "A")}],
        "concurrencies": [4],
        "client": {"model": "m", "tokenizer": "/t", "dataset_root": "/d",
                   "command_prefix": [sys.executable, str(FAKES / "fake_client.py")]},
        "server": {"port": port, "poll_s": 0.1},
    }  # fmt: skip
    (tmp_path / "c.json").write_text(json.dumps(data))
    proc = subprocess.run(
        [sys.executable, "-m", "minicpm_speech_perf.cli", "sweep", "--config",
         str(tmp_path / "c.json"), "--termination-log", str(tmp_path / "tlog")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "perf-jobs")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    msg = parse_termination_message((tmp_path / "tlog").read_text())
    assert msg["points"][0]["c"] == 4 and msg["points"][0]["ok"] == 128
    # Without a driver NVML is unavailable: recorded as null, never a number.
    if not os.path.exists("/dev/nvidiactl"):
        assert msg["points"][0]["mem_mib"] is None


def test_sigterm_to_the_job_stops_client_and_server(tmp_path: Path, events: Path) -> None:
    port = free_port()
    data = {
        "config_hash": "term",
        "artifacts_dir": str(tmp_path / "art"),
        "arms": [{"name": "A", "command": server_cmd(events, port, "A")}],
        "concurrencies": [1],
        "client": {"model": "m", "tokenizer": "/t", "dataset_root": "/d",
                   "command_prefix": [sys.executable, str(FAKES / "fake_client.py")]},
        "server": {"port": port, "poll_s": 0.1},
    }  # fmt: skip
    (tmp_path / "c.json").write_text(json.dumps(data))
    job = subprocess.Popen(
        [sys.executable, "-m", "minicpm_speech_perf.cli", "sweep", "--config",
         str(tmp_path / "c.json"), "--termination-log", str(tmp_path / "tlog")],
        env={**os.environ, "FAKE_CLIENT_SLEEP": "60",
             "PYTHONPATH": str(Path(__file__).parents[2] / "perf-jobs")},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (events.exists() and '"who": "client"' in events.read_text()):
            assert time.monotonic() < deadline, "the client never started"
            time.sleep(0.05)
        job.send_signal(15)
        _, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 1
    assert "terminated by SIGTERM" in err
    msg = parse_termination_message((tmp_path / "tlog").read_text())
    assert msg["status"] == "failed" and msg["reason"] == "terminated by SIGTERM"
    server = [e["event"] for e in read_events(events) if e["who"] == "server"]
    assert server == ["start", "ready", "sigterm", "exit"]
    assert not processes_mentioning(str(tmp_path / "art")), "a client outlived the Job"


def processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_ready_port_points_the_readiness_check_at_the_supervisor() -> None:
    from minicpm_speech_perf.config import ServerSettings

    server = ServerSettings(port=8091, ready_port=9400, ready_path="/readyz")
    assert server.ready_url == "http://127.0.0.1:9400/readyz"
    assert server.base_url == "http://127.0.0.1:8091"
    assert ServerSettings(port=8091).ready_url == "http://127.0.0.1:8091/health"
