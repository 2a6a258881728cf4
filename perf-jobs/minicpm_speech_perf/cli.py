"""`perf-jobs`: the entry point of the perf Job containers.

    perf-jobs sweep --config FILE          timing sweep (fresh servers, ABBA), summary, message
    perf-jobs wer run --config FILE        quality run (+ re-scoring when configured), message
    perf-jobs wer rescore --wavs DIR ...   independent re-scoring of saved WAVs
    perf-jobs summarize --artifacts DIR    re-summarise a sweep's result files
    perf-jobs dataset prepare|check ...    build / verify the ordered 64-request subset

Bad input exits 2 with one line naming what is wrong; a run that failed exits 1 after
writing its (failed) termination message; success exits 0.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from . import __version__
from .config import ConfigError, load_mapping, parse_quality, parse_sweep
from .dataset import DatasetError
from .protocol import ProtocolError
from .results import ResultFormatError

BAD_INPUT = 2
RUN_FAILED = 1

_INPUT_ERRORS = (
    ConfigError,
    DatasetError,
    ProtocolError,
    ResultFormatError,
    ValueError,
    OSError,
)
PERF_EXTRA = "pip install 'minicpm-speech[perf]'"


def _input_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean bad input. The re-scorer's live in a module that needs the
    ``perf`` extra (numpy, jiwer), imported only by the commands that use it, so that
    ``--help`` and the other commands run without it; if it was imported, they count too."""
    rescore = sys.modules.get(f"{__package__}.rescore")
    if rescore is None:
        return _INPUT_ERRORS
    return (*_INPUT_ERRORS, rescore.WavError, rescore.AsrModelError)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="perf-jobs", description="MiniCPM-o speech perf Jobs")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("sweep", help="timing sweep with the official client")
    s.add_argument("--config", type=Path, required=True, help="JSON or YAML sweep config")
    s.add_argument("--termination-log", type=Path, help="overrides the config's path")

    w = sub.add_parser("wer", help="quality run and re-scoring")
    wsub = w.add_subparsers(dest="action", required=True)
    wr = wsub.add_parser("run", help="quality run with the official evaluator")
    wr.add_argument("--config", type=Path, required=True)
    wr.add_argument("--termination-log", type=Path)
    rs = wsub.add_parser("rescore", help="score saved WAVs with faster-whisper + jiwer")
    rs.add_argument("--wavs", type=Path, required=True, help="folder of saved WAVs")
    src = rs.add_mutually_exclusive_group(required=True)
    src.add_argument("--result", type=Path, help="quality result JSON (reference texts)")
    src.add_argument("--meta", type=Path, help="Seed-TTS meta.lst (reference texts)")
    rs.add_argument("--model", type=Path, required=True, help="CTranslate2 Whisper folder")
    rs.add_argument("--device", default="cpu")
    rs.add_argument("--compute-type", default="int8")
    rs.add_argument("--beam-size", type=int, default=5)
    rs.add_argument("--allow-resample", action="store_true", help="score non-24 kHz WAVs")
    rs.add_argument("--out", type=Path, help="write the per-item report here")

    m = sub.add_parser("summarize", help="summarise a sweep's result files")
    m.add_argument("--artifacts", type=Path, required=True)
    m.add_argument("--termination-log", type=Path)

    d = sub.add_parser("dataset", help="prepare or check the Seed-TTS subset")
    dsub = d.add_subparsers(dest="action", required=True)
    dp = dsub.add_parser("prepare", help="write the ordered subset from a full copy")
    dp.add_argument("--source", type=Path, required=True, help="root holding en/meta.lst")
    dp.add_argument("--dest", type=Path, required=True)
    dp.add_argument("--hashes", type=Path, help="sha256sum file, paths relative to en/")
    dp.add_argument("--link", action="store_true", help="hard-link WAVs instead of copying")
    dc = dsub.add_parser("check", help="verify a prepared subset")
    dc.add_argument("--root", type=Path, required=True)
    dc.add_argument("--hashes", type=Path)
    return p


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    from .sweep import JobTerminated

    raise JobTerminated("terminated by SIGTERM")


def _load(cfg_path: Path, override: Path | None) -> dict[str, object]:
    data = dict(load_mapping(cfg_path))
    if override is not None:
        data["termination_log"] = str(override)
    return data


def cmd_sweep(args: argparse.Namespace) -> int:
    from .procs import SubprocessRunner
    from .sweep import finish_sweep, run_sweep

    cfg = parse_sweep(_load(args.config, args.termination_log))
    signal.signal(signal.SIGTERM, _on_sigterm)
    manifest = run_sweep(cfg, SubprocessRunner())
    rc, message = finish_sweep(cfg, manifest)
    return _report("sweep", rc, message)


def cmd_wer_run(args: argparse.Namespace) -> int:
    from .procs import SubprocessRunner
    from .wer import finish_quality, run_quality

    cfg = parse_quality(_load(args.config, args.termination_log))
    signal.signal(signal.SIGTERM, _on_sigterm)
    manifest = run_quality(cfg, SubprocessRunner())
    rc, message = finish_quality(cfg, manifest)
    return _report("wer", rc, message)


def _report(name: str, rc: int, message: str) -> int:
    print(message)
    if rc != 0:
        reason = json.loads(message).get("reason", "")
        print(f"perf-jobs {name}: failed: {reason}", file=sys.stderr)
    return rc


def cmd_wer_rescore(args: argparse.Namespace) -> int:
    from .rescore import WhisperTranscriber
    from .wer import rescore_saved

    asr = WhisperTranscriber(
        args.model, device=args.device, compute_type=args.compute_type, beam_size=args.beam_size
    )
    report = rescore_saved(
        args.wavs, asr, result=args.result, meta=args.meta, allow_resample=args.allow_resample
    )
    if args.out is not None:
        args.out.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"mean_wer": report.mean_wer, "judged": report.judged,
                      "failed": report.failed}))  # fmt: skip
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    from .summarize import Point, load_manifest, summarize, sweep_message

    if not args.artifacts.is_dir():
        raise ValueError(f"{args.artifacts}: not a directory")
    manifest = load_manifest(args.artifacts) or {}
    doc = summarize(args.artifacts)
    if {"config_hash", "mode", "started", "finished"} <= manifest.keys() and manifest.get(
        "finished"
    ):
        header = {k: manifest[k] for k in ("config_hash", "mode", "baseline", "started")}
        header |= {
            "finished": manifest["finished"],
            "status": manifest.get("status", "ok"),
            "reason": manifest.get("reason", ""),
        }
        message = sweep_message(header, [Point(**p) for p in doc["points"]])
        (args.artifacts / "termination-message.json").write_text(message + "\n")
        if args.termination_log is not None:
            args.termination_log.write_text(message)
        print(message)
    else:
        print(json.dumps({"points": len(doc["points"]), "summary": "summary.json"}))
    return 0


def cmd_dataset(args: argparse.Namespace) -> int:
    from .dataset import check, prepare

    if args.action == "prepare":
        report = prepare(args.source, args.dest, hashes_file=args.hashes, link=args.link)
    else:
        report = check(args.root, hashes_file=args.hashes)
    print(json.dumps({"root": report.root, "rows": report.rows,
                      "distinct_wavs": report.distinct_wavs,
                      "hashes_checked": report.hashes_checked}))  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    name = " ".join(x for x in (args.command, getattr(args, "action", None)) if x)
    handlers = {
        "sweep": cmd_sweep,
        "wer run": cmd_wer_run,
        "wer rescore": cmd_wer_rescore,
        "summarize": cmd_summarize,
        "dataset prepare": cmd_dataset,
        "dataset check": cmd_dataset,
    }
    try:
        return handlers[name](args)
    except ModuleNotFoundError as exc:
        print(f"perf-jobs {name}: error: needs the module {exc.name!r} of the perf extra; "
              f"install it with: {PERF_EXTRA}", file=sys.stderr)
        return BAD_INPUT
    except _input_errors() as exc:
        line = " ".join(str(exc).split())
        print(f"perf-jobs {name}: error: {line}", file=sys.stderr)
        return BAD_INPUT
    except RuntimeError as exc:  # e.g. the termination log cannot be written
        line = " ".join(str(exc).split())
        print(f"perf-jobs {name}: failed: {line}", file=sys.stderr)
        return RUN_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
