"""The timing sweep run inside the Job: fresh server per arm visit, the official client per run.

Artifacts (under `artifacts_dir`): `manifest.json` (rewritten after every run, so a Job that
dies still leaves what it measured), `extra-body.json`, `results/*.json` (the client's own
files), `logs/*.log`, then the summary files and `termination-message.json`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from . import protocol
from .config import Arm, SweepConfig
from .gpumem import MemorySampler, NvmlSampler
from .procs import ProcessError, ProcessRunner, ServerHandle, answers_ok, wait_ready

MANIFEST_SCHEMA = "minicpm-speech-perf/manifest/v1"


class SweepError(RuntimeError):
    """A run that cannot be trusted: the sweep stops and reports why."""


class JobTerminated(Exception):
    """SIGTERM reached the Job: unwind so the server is stopped before the pod goes."""


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Orchestrator:
    """Runs visits of a plan with an injected process runner and memory sampler."""

    def __init__(
        self,
        cfg: SweepConfig,
        runner: ProcessRunner,
        sampler_factory: Callable[[], MemorySampler] | None = None,
        *,
        kind: str = "sweep",
    ) -> None:
        self.cfg = cfg
        self.runner = runner
        self.sampler_factory = sampler_factory or (lambda: NvmlSampler(cfg.gpu_index))
        self.root = cfg.artifacts_dir
        self.manifest: dict[str, Any] = {
            "schema": MANIFEST_SCHEMA,
            "kind": kind,
            "mode": cfg.mode,
            "config_hash": cfg.config_hash,
            "baseline": cfg.arms[0].name if len(cfg.arms) == 2 else None,
            "arms": [a.name for a in cfg.arms],
            "requests": {**asdict(cfg.counts), "protocol": cfg.counts.is_protocol},
            "started": utc_now(),
            "finished": None,
            "status": "running",
            "reason": "",
            "visits": [],
        }

    def prepare(self) -> None:
        for sub in ("results", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "extra-body.json").write_text(protocol.extra_body_json() + "\n")
        self.save()

    def save(self) -> None:
        tmp = self.root / "manifest.json.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.root / "manifest.json")

    def arm(self, name: str) -> Arm:
        return next(a for a in self.cfg.arms if a.name == name)

    def run_plan(
        self, visits: list[protocol.Visit], env_for: Callable[[protocol.Run], dict[str, str]]
    ) -> dict[str, Any]:
        """Run every visit; failures end the plan with status 'failed' and a reason."""
        self.prepare()
        try:
            for visit in visits:
                self.run_visit(visit, env_for)
            self.manifest["status"] = "ok"
        except (SweepError, ProcessError, protocol.ProtocolError, OSError, JobTerminated) as exc:
            self.manifest["status"] = "failed"
            self.manifest["reason"] = str(exc) or type(exc).__name__
        finally:
            self.manifest["finished"] = utc_now()
            self.save()
        return self.manifest

    def run_visit(
        self, visit: protocol.Visit, env_for: Callable[[protocol.Run], dict[str, str]]
    ) -> None:
        record: dict[str, Any] = {
            "arm": visit.arm,
            "index": visit.index,
            "label": visit.label,
            "fresh_server": visit.fresh_server,
            "started": utc_now(),
            "runs": [],
        }
        self.manifest["visits"].append(record)
        server = self.start_server(visit, record) if visit.fresh_server else None
        try:
            log = self.root / "logs" / f"server-{visit.label}.log" if server else None
            ready_s = wait_ready(
                self.cfg.ready_url,
                timeout_s=self.cfg.server.ready_timeout_s,
                server=server,
                poll_s=self.cfg.server.poll_s,
                log_path=log,
            )
            record["ready_after_s"] = round(ready_s, 3)
            self.save()
            for run in visit.runs:
                record["runs"].append(self.run_client(run, env_for(run), server))
                self.save()
        finally:
            if server is not None:
                record["server_exit_code"] = server.stop(self.cfg.server.stop_grace_s)
            record["finished"] = utc_now()
            self.save()

    def start_server(self, visit: protocol.Visit, record: dict[str, Any]) -> ServerHandle:
        # A server still answering here would be measured instead of the fresh one.
        if answers_ok(self.cfg.ready_url, timeout_s=2.0):
            raise SweepError(f"{self.cfg.ready_url} already answers before {visit.label} started")
        arm = self.arm(visit.arm)
        record["server_command"] = list(arm.command)
        env = {**os.environ, **arm.env}
        log = self.root / "logs" / f"server-{visit.label}.log"
        return self.runner.start_server(arm.command, env, log)

    def run_client(
        self, run: protocol.Run, env: Mapping[str, str], server: ServerHandle | None
    ) -> dict[str, Any]:
        argv = protocol.build_client_command(
            self.cfg.target(),
            num_prompts=run.num_prompts,
            concurrency=run.concurrency,
            result_dir=str(self.root / "results"),
            result_filename=run.result_filename,
        )
        result = self.root / "results" / run.result_filename
        log = self.root / "logs" / f"{run.name}.log"
        result.unlink(missing_ok=True)  # a stale file must not pass for this run's result
        rec: dict[str, Any] = {
            "name": run.name,
            "kind": run.kind,
            "concurrency": run.concurrency,
            "num_prompts": run.num_prompts,
            "repeat": run.repeat,
            "result": f"results/{run.result_filename}",
            "log": f"logs/{run.name}.log",
            "argv": argv,
            "started": utc_now(),
        }
        t0 = time.monotonic()
        if run.kind in ("measured", "quality"):
            with self.sampler_factory() as sampler:
                rc = self.runner.run_client(argv, env, log, self.cfg.client.run_timeout_s)
            rec["gpu_memory"] = sampler.reading().to_json()
        else:
            rc = self.runner.run_client(argv, env, log, self.cfg.client.run_timeout_s)
        rec["wall_s"] = round(time.monotonic() - t0, 3)
        rec["exit_code"] = rc
        if rc != 0:
            raise SweepError(f"{run.name}: client exited with code {rc} (log: {log})")
        if not result.is_file():
            raise SweepError(f"{run.name}: client wrote no result file {result}")
        if server is not None and (code := server.poll()) is not None:
            raise SweepError(f"{run.name}: server exited with code {code} during the run")
        return rec


def run_sweep(
    cfg: SweepConfig,
    runner: ProcessRunner,
    sampler_factory: Callable[[], MemorySampler] | None = None,
) -> dict[str, Any]:
    """Run the whole timing plan; returns the final manifest (status ok or failed)."""
    visits = protocol.plan_sweep(
        [a.name for a in cfg.arms], cfg.mode, cfg.concurrencies, cfg.counts
    )
    orch = Orchestrator(cfg, runner, sampler_factory)
    return orch.run_plan(visits, lambda _run: protocol.timing_env(os.environ))


def finish_sweep(cfg: SweepConfig, manifest: dict[str, Any]) -> tuple[int, str]:
    """Summarise what was measured and write the termination message; returns (rc, message)."""
    from .results import ResultFormatError
    from .summarize import Point, SummaryError, summarize, sweep_message

    header = {k: manifest[k] for k in ("config_hash", "mode", "baseline", "started", "finished")}
    header |= {"status": manifest["status"], "reason": manifest["reason"]}
    points: list[Point] = []
    try:
        doc = summarize(cfg.artifacts_dir, header)
        points = [Point(**p) for p in doc["points"]]
    except (ResultFormatError, SummaryError, OSError) as exc:
        header |= {"status": "failed", "reason": f"summarize: {exc}"}
    message = sweep_message(header, points)
    write_termination(cfg, message)
    return (0 if header["status"] == "ok" else 1), message


def write_termination(cfg: SweepConfig, message: str) -> None:
    (cfg.artifacts_dir / "termination-message.json").write_text(message + "\n", encoding="utf-8")
    if cfg.termination_log is not None:
        try:
            cfg.termination_log.write_text(message, encoding="utf-8")
        except OSError as exc:
            raise SweepError(f"cannot write termination log {cfg.termination_log}: {exc}") from None
