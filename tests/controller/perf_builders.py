"""Shared inputs of the benchmark unit tests: perf-enabled specs, Jobs and messages."""

from __future__ import annotations

from typing import Any

from minicpm_speech_operator.manifests import Owner, owner_of
from minicpm_speech_operator.perf.jobs import Arm
from minicpm_speech_operator.perf.lastgood import LastGood
from minicpm_speech_operator.serving_config import ServingConfig, profile_document, serving_config
from minicpm_speech_operator.spec import SpeechSpec, parse_spec
from minicpm_speech_perf.summarize import Point, sweep_message
from minicpm_speech_perf.wer import wer_message

from .builders import claim_spec, speech_body

STARTED, FINISHED = "2026-11-29T10:00:00Z", "2026-11-29T11:00:00Z"


def perf_raw(placement: str = "dedicated", base: dict[str, Any] | None = None,
             changes: dict[str, Any] | None = None, **perf: Any) -> dict[str, Any]:
    """A perf-enabled spec; ``changes`` replace top-level spec fields, ``perf`` its perf."""
    spec = {**(base if base is not None else speech_body()["spec"]), **(changes or {})}
    spec["perf"] = {"enabled": True, "placement": placement, "concurrencies": [1, 8],
                    "datasetClaim": "seed-tts", "asrModelClaim": "whisper", **perf}
    return spec


def arm(raw: dict[str, Any]) -> tuple[Owner, Arm]:
    body = speech_body(raw)
    spec = parse_spec(body["spec"])
    return owner_of(body), Arm(spec, serving_config(spec, profile_document(spec, None)))


def claim_perf_raw(placement: str = "dedicated", **perf: Any) -> dict[str, Any]:
    return perf_raw(placement, claim_spec(), **perf)


def point(arm_name: str, c: int, tput: float, p95: float = 900.0, ok: int = 256) -> Point:
    return Point(arm_name, c, 4, tput, tput * 0.98, tput * 1.02, p95 * 0.6, p95 * 0.5,
                 p95 * 0.7, p95, 0.2, tput / 4, ok, 256, 40960.0)


def sweep_text(config_hash: str, tput: float, baseline: float | None = None,
               mode: str = "dedicated") -> str:
    arms = [("B", tput)] + ([("A", baseline)] if baseline is not None else [])
    points = [point(name, c, value * (c / 8)) for name, value in arms for c in (1, 8)]
    return sweep_message({"config_hash": config_hash, "mode": mode, "started": STARTED,
                          "finished": FINISHED, "baseline": "A" if baseline else None}, points)


SIM_MODEL, MOS_MODEL = "resemblyzer-0.1.4", "distillmos-0.9.1"


def wer_text(config_hash: str, wer: float, mode: str = "dedicated", sim: float = 0.72,
             mos: float = 3.9) -> str:
    rows = [{"concurrency": c, "wer": wer, "completed": 64, "judged": 64, "total": 64,
             **quality_figures(sim, mos), "rescored": None, "rescored_judged": 0}
            for c in (8, 1)]
    return wer_message({"config_hash": config_hash, "mode": mode, "started": STARTED,
                        "finished": FINISHED, "status": "ok", "reason": "", "rows": rows,
                        "sim_model": SIM_MODEL, "mos_model": MOS_MODEL})


def quality_figures(sim: float, mos: float) -> dict[str, float | int]:
    return {"sim": sim, "sim_p10": sim - 0.05, "sim_n": 64,
            "mos": mos, "mos_p10": mos - 0.3, "mos_n": 64}


def last_good(spec: SpeechSpec, cfg: ServingConfig, tput: float = 25.0,
              wer: float = 0.03) -> LastGood:
    return LastGood(cfg.config_hash, cfg.profile_label, cfg.deploy_config, spec.raw, {
        "points": [{"arm": "B", "c": 8, "tput": tput, "ttfp_ms": 500.0, "ttfp_p95_ms": 900.0,
                    "ok": 256, "n": 256}],
        "wer": [{"c": 8, "wer": wer, "done": 64, "judged": 64, "n": 64,
                 **quality_figures(0.72, 3.9)}],
        "sim_model": SIM_MODEL, "mos_model": MOS_MODEL,
        "gate": {"sweep": {"reason": "NoBaseline", "message": "first"},
                 "wer": {"reason": "WithinLimits", "message": "ok"}},
        "recordedAt": FINISHED,
    })
