"""The quality run: its own server start, the same warm-up, then 64 requests with the
official Seed-TTS WER evaluator at C8 (as published), C1 and the highest gated concurrency.

The generated WAVs are kept under `wavs/c{C}/`; when a re-scorer model is configured every
kept WAV is also scored independently. Every kept WAV is also scored for speaker similarity
to its reference prompt (SIM) and for predicted naturalness (MOS). Results:
`wer_summary.json` and the termination message of kind "wer".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minicpm_speech_contract import termination

from . import protocol
from .config import QualityConfig
from .dataset import DatasetError, parse_meta
from .gpumem import MemorySampler
from .naturalness import MosPredictor, default_mos_predictor, mos_of_wav
from .procs import ProcessRunner
from .quality_figures import MOS, SIM, InvalidFigureError, summarize_figure
from .quality_report import quality_markdown, write_quality_plot
from .rescore import (
    AsrModelError,
    Item,
    RescoreReport,
    Transcriber,
    WavError,
    WhisperTranscriber,
    rescore,
)
from .results import ResultFormatError, WerResult, parse_run, parse_wer
from .similarity import SpeakerEncoder, default_speaker_encoder, speaker_similarity
from .sweep import Orchestrator, write_termination

WER_SUMMARY_SCHEMA = "minicpm-speech-perf/wer-summary/v1"
_SAVED_WAV = re.compile(r"^(?P<index>\d{5})_(?P<utt>.+)_(?P<locale>[a-z]{2})\.wav$")


def wav_dir(root: Path, concurrency: int) -> Path:
    return root / "wavs" / f"c{concurrency}"


def run_quality(
    cfg: QualityConfig,
    runner: ProcessRunner,
    sampler_factory: Callable[[], MemorySampler] | None = None,
) -> dict[str, Any]:
    """Server start, warm-up, the quality runs; returns the manifest."""
    base = cfg.sweep
    visit = protocol.plan_quality(
        base.arms[0].name, base.mode, cfg.highest_gated_concurrency, base.counts
    )

    def env_for(run: protocol.Run) -> dict[str, str]:
        if run.kind != "quality":
            return protocol.timing_env(os.environ)
        audio = wav_dir(base.artifacts_dir, run.concurrency)
        audio.mkdir(parents=True, exist_ok=True)
        return protocol.quality_env(
            os.environ, whisper_model=cfg.whisper_model, audio_dir=str(audio),
            device=cfg.eval_device, speaker_model=cfg.speaker_model,
        )  # fmt: skip

    orch = Orchestrator(base, runner, sampler_factory, kind="wer")
    orch.manifest["baseline"] = None
    return orch.run_plan([visit], env_for)


def items_from_result(result: WerResult, wavs: Path) -> list[Item]:
    """Scorable items of the official per-request list, WAVs looked up in `wavs`.

    The client recorded absolute paths inside the pod; the volume may be mounted elsewhere
    when re-scoring later, so the file name is resolved in `wavs` when the path is absent.
    """
    items = []
    for it in result.items:
        if it.error in ("request_failed", "no_pcm") or not it.reference:
            continue
        path = Path(it.audio_path) if it.audio_path else None
        if path is None or not path.is_file():
            name = path.name if path else f"*_{it.utterance_id}_en.wav"
            found = sorted(wavs.glob(name))
            path = found[0] if found else wavs / name
        items.append(Item(it.utterance_id, path, it.reference))
    return items


def items_from_meta(wavs: Path, meta: Path) -> list[Item]:
    """Saved WAVs (`NNNNN_UTT_LOCALE.wav`) matched to their target text in meta.lst."""
    texts = {r.utterance_id: r.target_text for r in parse_meta(meta)}
    items = []
    for path in sorted(wavs.glob("*.wav")):
        m = _SAVED_WAV.match(path.name)
        if m is None or m["utt"] not in texts:
            raise ValueError(f"{path}: no meta.lst row for this WAV")
        items.append(Item(m["utt"], path, texts[m["utt"]]))
    return items


OFFICIAL_SIM_MODEL = "seed-tts-wavlm"


@dataclass(frozen=True, slots=True)
class VoiceModels:
    """The models behind SIM and MOS, loaded once per Job. Without a ``speaker`` encoder,
    SIM is the official evaluator's, from its WavLM (``speaker_model`` in the config)."""

    speaker: SpeakerEncoder | None
    naturalness: MosPredictor
    sim_model: str

    @classmethod
    def default(cls, official_speaker_model: str | None = None) -> VoiceModels:
        if official_speaker_model:
            name = f"{OFFICIAL_SIM_MODEL}:{Path(official_speaker_model).name}"[:64]
            return cls(None, default_mos_predictor(), name)
        speaker = default_speaker_encoder()
        return cls(speaker, default_mos_predictor(), speaker.name)


def reference_wavs(dataset_root: str) -> dict[str, Path]:
    """Each utterance's reference voice: the prompt WAV its meta.lst row names."""
    locale_dir = Path(dataset_root) / "en"
    return {row.utterance_id: locale_dir / row.prompt_wav
            for row in parse_meta(locale_dir / "meta.lst")}


def voice_figures(items: Sequence[Item], references: dict[str, Path], models: VoiceModels,
                  official: WerResult) -> dict[str, Any]:
    """SIM and MOS of one concurrency's WAVs: mean, p10 and count of each, or null with the
    reason when the set cannot be trusted (the gate then fails on the missing figure). A WAV
    that cannot be scored leaves its utterance out, counted."""
    sims: dict[str, float | None] = {}
    moses: dict[str, float | None] = {}
    official_sims = {it.utterance_id: it.sim for it in official.items}
    for item in items:
        reference = references.get(item.utterance_id)
        try:
            sims[item.utterance_id] = (
                official_sims.get(item.utterance_id) if models.speaker is None
                else None if reference is None
                else speaker_similarity(models.speaker, reference, item.wav))
        except WavError:
            sims[item.utterance_id] = None
        try:
            moses[item.utterance_id] = mos_of_wav(models.naturalness, item.wav)
        except WavError:
            moses[item.utterance_id] = None
    # Per utterance too, for the report's distributions (the message keeps only summaries).
    row: dict[str, Any] = {"sim_items": sims, "mos_items": moses}
    for key, figure, values in (("sim", SIM, sims), ("mos", MOS, moses)):
        try:
            summary = summarize_figure(figure, values)
        except InvalidFigureError as exc:
            row.update({key: None, f"{key}_p10": None, f"{key}_n": 0,
                        f"{key}_error": exc.reason})
            continue
        row.update({key: summary.mean, f"{key}_p10": summary.p10, f"{key}_n": summary.count})
    return row


def summarize_quality(
    cfg: QualityConfig, manifest: dict[str, Any], asr: Transcriber | None,
    voice: VoiceModels | None = None,
) -> dict[str, Any]:
    """Per quality concurrency: official WER and counts, the re-scorer's verdict, and the
    speech's similarity to its reference voice and its naturalness."""
    root = cfg.sweep.artifacts_dir
    references = (reference_wavs(cfg.sweep.client.dataset_root)
                  if voice is not None and voice.speaker is not None else {})
    rows = []
    for visit in manifest["visits"]:
        for run in visit["runs"]:
            if run["kind"] != "quality" or run.get("exit_code") != 0:
                continue
            rows.append(_quality_row(root, run, asr, voice, references))
    doc = {
        "schema": WER_SUMMARY_SCHEMA,
        **{k: manifest.get(k) for k in ("config_hash", "mode", "started", "finished")},
        "status": manifest["status"],
        "reason": manifest["reason"],
        **({"sim_model": voice.sim_model, "mos_model": voice.naturalness.name}
           if voice is not None else {}),
        "rows": rows,
    }
    (root / "wer_summary.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (root / "quality.md").write_text(quality_markdown(doc), encoding="utf-8")
    if any(row.get("sim_items") or row.get("mos_items") for row in rows):
        write_quality_plot(rows, root)
    return doc


def _quality_row(root: Path, run: dict[str, Any], asr: Transcriber | None,
                 voice: VoiceModels | None, references: dict[str, Path]) -> dict[str, Any]:
    path = root / run["result"]
    c = int(run["concurrency"])
    timing = parse_run(path, expect_concurrency=c)
    official = parse_wer(path)
    row: dict[str, Any] = {
        "concurrency": c,
        "wer": official.mean_wer,
        "completed": timing.completed,
        "judged": official.evaluated,
        "total": timing.num_prompts,
        "saved_wavs": official.saved_audio,
        "wav_dir": str(wav_dir(root, c).relative_to(root)),
        "rescored": None,
        "rescored_judged": 0,
    }
    items = items_from_result(official, wav_dir(root, c))
    if voice is not None:
        row.update(voice_figures(items, references, voice, official))
    if asr is not None:
        report = rescore(items, asr)
        _write_report(root / f"rescore-c{c}.json", report)
        row["rescored"] = report.mean_wer
        row["rescored_judged"] = report.judged
    return row


def _write_report(path: Path, report: RescoreReport) -> None:
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")


def wer_message(doc: dict[str, Any]) -> str:
    rs = termination.round_sig
    models = {key: doc[key] for key in termination.QUALITY_MODEL_KEYS if doc.get(key)}
    return termination.encode(
        {
            "v": termination.VERSION,
            "kind": "wer",
            "status": doc["status"],
            "hash": doc["config_hash"],
            "mode": doc["mode"],
            "started": doc["started"],
            "finished": doc["finished"],
            "reason": doc["reason"],
            **models,
            "wer": [
                {
                    "c": r["concurrency"],
                    "wer": rs(r["wer"]),
                    "done": r["completed"],
                    "judged": r["judged"],
                    "n": r["total"],
                    **{key: rs(r.get(key)) for key in ("sim", "sim_p10", "mos", "mos_p10")},
                    "sim_n": r.get("sim_n", 0),
                    "mos_n": r.get("mos_n", 0),
                    "rescored": rs(r["rescored"]),
                    "rescored_judged": r["rescored_judged"],
                }
                for r in doc["rows"]
            ],
        }
    )


def finish_quality(
    cfg: QualityConfig, manifest: dict[str, Any], asr: Transcriber | None = None,
    voice: VoiceModels | None = None,
) -> tuple[int, str]:
    """Summarise, write the termination message; returns (exit code, message)."""
    try:
        if asr is None and cfg.rescore is not None and manifest["status"] == "ok":
            r = cfg.rescore
            asr = WhisperTranscriber(
                r.model, device=r.device, compute_type=r.compute_type, beam_size=r.beam_size
            )
        if voice is None and manifest["status"] == "ok":
            voice = VoiceModels.default(cfg.speaker_model)
        doc = summarize_quality(cfg, manifest, asr, voice)
    except (ResultFormatError, AsrModelError, DatasetError, OSError, ValueError,
            RuntimeError) as exc:
        doc = {
            **{k: manifest.get(k) for k in ("config_hash", "mode", "started", "finished")},
            "status": "failed",
            "reason": f"summarize: {exc}",
            "rows": [],
        }
    message = wer_message(doc)
    write_termination(cfg.sweep, message)
    return (0 if doc["status"] == "ok" else 1), message


def rescore_saved(
    wavs: Path,
    asr: Transcriber,
    *,
    result: Path | None = None,
    meta: Path | None = None,
    allow_resample: bool = False,
) -> RescoreReport:
    """Standalone re-scoring of a WAV folder, texts from a result file or a meta.lst."""
    items: Sequence[Item]
    if result is not None:
        items = items_from_result(parse_wer(result), wavs)
    elif meta is not None:
        items = items_from_meta(wavs, meta)
    else:
        raise ValueError("give the quality result file or the meta.lst for reference texts")
    if not items:
        raise ValueError(f"{wavs}: nothing to score")
    return rescore(items, asr, allow_resample=allow_resample)
