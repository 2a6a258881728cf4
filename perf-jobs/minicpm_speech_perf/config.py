"""Job configuration: read from a JSON or YAML file, checked field by field.

Every error names the dotted key at fault, so the Job exits with one line that says what to
fix. Unknown keys are refused: a typo must not silently fall back to a default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from minicpm_speech_contract.bounded import BoundedInputError, load_json, load_yaml

from . import protocol


class ConfigError(ValueError):
    """Bad configuration; the message names the key."""


class _Section:
    """A mapping being read: tracks its dotted path and which keys were consumed."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path or 'config'}: must be a mapping")
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, default: Any = None, *, required: bool = False) -> Any:
        self.used.add(name)
        if name not in self.data:
            if required:
                raise ConfigError(f"{self.key(name)}: required")
            return default
        return self.data[name]

    def string(self, name: str, default: str | None = None, *, required: bool = False) -> str:
        value = self.get(name, default, required=required)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{self.key(name)}: must be a non-empty string")
        return value

    def number(self, name: str, default: float, *, minimum: float = 0.0) -> float:
        value = self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= minimum:
            raise ConfigError(f"{self.key(name)}: must be a number > {minimum:g}")
        return float(value)

    def integer(self, name: str, default: int, *, lo: int, hi: int) -> int:
        value = self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ConfigError(f"{self.key(name)}: must be an integer in [{lo}, {hi}]")
        return value

    def strings(self, name: str, default: list[str] | None = None) -> tuple[str, ...]:
        value = self.get(name, default, required=default is None)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{self.key(name)}: must be a list of non-empty strings")
        return tuple(value)

    def env(self, name: str) -> dict[str, str]:
        value = self.get(name, {})
        ok = isinstance(value, Mapping) and all(
            isinstance(k, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k) and isinstance(v, str)
            for k, v in value.items()
        )
        if not ok:
            raise ConfigError(f"{self.key(name)}: must map variable names to string values")
        return dict(value)

    def section(self, name: str, *, required: bool = False) -> _Section:
        return _Section(self.get(name, {}, required=required), self.key(name))

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ConfigError(f"{self.key(str(unknown[0]))}: unknown key")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8091
    ready_path: str = "/health"
    # The serving supervisor reports ready (warm-up and graph precapture done) on its own
    # health port, after the API port already answers; None checks the API port.
    ready_port: int | None = None
    ready_timeout_s: float = 1800.0
    stop_grace_s: float = 60.0
    poll_s: float = 2.0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ready_url(self) -> str:
        return f"http://{self.host}:{self.ready_port or self.port}{self.ready_path}"


@dataclass(frozen=True, slots=True)
class ClientSettings:
    model: str
    tokenizer: str
    dataset_root: str
    command_prefix: tuple[str, ...] = ("vllm",)
    run_timeout_s: float = 3600.0
    base_url: str | None = None


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SweepConfig:
    mode: str
    config_hash: str
    artifacts_dir: Path
    arms: tuple[Arm, ...]
    client: ClientSettings
    server: ServerSettings
    concurrencies: tuple[int, ...] = protocol.CONCURRENCIES
    gpu_index: int = 0
    termination_log: Path | None = None
    counts: protocol.RequestCounts = protocol.PROTOCOL_COUNTS

    @property
    def base_url(self) -> str:
        return self.client.base_url or self.server.base_url

    @property
    def ready_url(self) -> str:
        if self.client.base_url:
            return self.client.base_url + self.server.ready_path
        return self.server.ready_url

    def target(self) -> protocol.ClientTarget:
        c = self.client
        return protocol.ClientTarget(
            self.base_url, c.model, c.tokenizer, c.dataset_root, c.command_prefix
        )


@dataclass(frozen=True, slots=True)
class RescoreSettings:
    model: str
    device: str = "cpu"
    compute_type: str = "int8"
    beam_size: int = 5


@dataclass(frozen=True, slots=True)
class QualityConfig:
    sweep: SweepConfig
    whisper_model: str
    eval_device: str = "cuda:0"
    highest_gated_concurrency: int = 32
    rescore: RescoreSettings | None = None
    # A Hugging Face WavLM speaker model folder: SIM then comes from the official evaluator's
    # own WavLM; without one, from the built-in speaker encoder (minicpm_speech_perf.similarity).
    speaker_model: str | None = None


def load_mapping(path: Path) -> Mapping[str, Any]:
    """Parse a .json, .yaml or .yml file into a mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = (load_json(text, field=str(path)) if path.suffix == ".json"
                else load_yaml(text, field=str(path)))
    except BoundedInputError as exc:
        raise ConfigError(str(exc)) from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise ConfigError(f"{path}: not valid {kind}: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def _server(s: _Section) -> ServerSettings:
    ready_path = s.string("ready_path", "/health")
    if not ready_path.startswith("/"):
        raise ConfigError(f"{s.key('ready_path')}: must start with '/'")
    out = ServerSettings(
        host=s.string("host", "127.0.0.1"),
        port=s.integer("port", 8091, lo=1, hi=65535),
        ready_path=ready_path,
        ready_port=s.integer("ready_port", 0, lo=0, hi=65535) or None,
        ready_timeout_s=s.number("ready_timeout_s", 1800.0),
        stop_grace_s=s.number("stop_grace_s", 60.0),
        poll_s=s.number("poll_s", 2.0),
    )
    s.done()
    return out


def _client(s: _Section, live: bool) -> ClientSettings:
    base_url = s.get("base_url")
    if live and base_url is None:
        raise ConfigError(f"{s.key('base_url')}: required in live mode (the serving Service)")
    if base_url is not None and (
        not isinstance(base_url, str) or not re.match(r"^https?://[^/\s]+$", base_url)
    ):
        raise ConfigError(f"{s.key('base_url')}: must be http(s)://HOST:PORT")
    out = ClientSettings(
        model=s.string("model", required=True),
        tokenizer=s.string("tokenizer", required=True),
        dataset_root=s.string("dataset_root", required=True),
        command_prefix=s.strings("command_prefix", ["vllm"]),
        run_timeout_s=s.number("run_timeout_s", 3600.0),
        base_url=base_url,
    )
    s.done()
    return out


def _arms(s: _Section, live: bool) -> tuple[Arm, ...]:
    raw = s.get("arms", required=True)
    if not isinstance(raw, list) or not raw:
        raise ConfigError("arms: must be a non-empty list")
    arms: list[Arm] = []
    for i, item in enumerate(raw):
        a = _Section(item, f"arms[{i}]")
        name = a.string("name", required=True)
        try:
            protocol.check_arm_name(name)
        except protocol.ProtocolError as exc:
            raise ConfigError(f"{a.key('name')}: {exc}") from None
        command = a.strings("command", []) if live else a.strings("command")
        if live and command:
            raise ConfigError(f"{a.key('command')}: live mode starts no server")
        if not live and not command:
            raise ConfigError(f"{a.key('command')}: must be a non-empty list of strings")
        arms.append(Arm(name, command, a.env("env")))
        a.done()
    return tuple(arms)


def _counts(s: _Section) -> protocol.RequestCounts:
    """``requests``: the protocol's counts unless a key says otherwise (see RequestCounts)."""
    default = protocol.PROTOCOL_COUNTS
    hi = protocol.NUM_PROMPTS
    counts = protocol.RequestCounts(
        measured=s.integer("measured", default.measured, lo=1, hi=hi),
        warmup=s.integer("warmup", default.warmup, lo=1, hi=hi),
        repeats=s.integer("repeats", default.repeats, lo=1, hi=protocol.MAX_REPEATS),
    )
    s.done()
    return counts


def parse_sweep(data: Mapping[str, Any]) -> SweepConfig:
    """Build and check a sweep configuration (also the base of a quality configuration)."""
    s = _Section(data, "")
    cfg = _parse_common(s)
    s.done()
    return cfg


def _parse_common(s: _Section) -> SweepConfig:
    mode = s.string("mode", "dedicated")
    if mode not in protocol.MODES:
        raise ConfigError(f"mode: must be one of {list(protocol.MODES)}")
    live = mode == "live"
    config_hash = s.string("config_hash", required=True)
    if not re.match(r"^[A-Za-z0-9._-]{1,64}$", config_hash):
        raise ConfigError("config_hash: 1-64 characters of [A-Za-z0-9._-]")
    arms = _arms(s, live)
    raw_conc = s.get("concurrencies", list(protocol.CONCURRENCIES))
    if not isinstance(raw_conc, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) for c in raw_conc
    ):
        raise ConfigError("concurrencies: must be a list of integers")
    try:
        protocol.visit_order([a.name for a in arms], mode)
        conc = protocol.check_concurrencies(raw_conc)
    except (protocol.ProtocolError, TypeError) as exc:
        raise ConfigError(f"arms/concurrencies: {exc}") from None
    term = s.get("termination_log")
    if term is not None and (not isinstance(term, str) or not term):
        raise ConfigError("termination_log: must be a path string")
    counts = _counts(s.section("requests"))
    cfg = SweepConfig(
        mode=mode,
        config_hash=config_hash,
        artifacts_dir=Path(s.string("artifacts_dir", required=True)),
        arms=arms,
        client=_client(s.section("client", required=True), live),
        server=_server(s.section("server")),
        concurrencies=conc,
        gpu_index=s.integer("gpu_index", 0, lo=0, hi=63),
        termination_log=Path(term) if term else None,
        counts=counts,
    )
    try:
        cfg.target()
    except protocol.ProtocolError as exc:
        raise ConfigError(f"client: {exc}") from None
    return cfg


def parse_quality(data: Mapping[str, Any]) -> QualityConfig:
    """A quality configuration: one arm, plus the ASR models for the two evaluators."""
    s = _Section(data, "")
    base = _parse_common(s)
    if len(base.arms) != 1:
        raise ConfigError("arms: the quality run serves exactly one arm")
    asr = s.section("asr", required=True)
    whisper_model = asr.string("whisper_model", required=True)
    device = asr.string("device", "cuda:0")
    asr.done()
    speaker_model = None
    if s.get("similarity") is not None:
        sim = s.section("similarity")
        speaker_model = sim.string("speaker_model", required=True)
        sim.done()
    highest = s.integer("highest_gated_concurrency", 32, lo=1, hi=32)
    if highest not in protocol.CONCURRENCIES:
        raise ConfigError(
            f"highest_gated_concurrency: must be among {list(protocol.CONCURRENCIES)}"
        )
    rescore = None
    if s.get("rescore") is not None:
        r = s.section("rescore")
        rescore = RescoreSettings(
            model=r.string("model", required=True),
            device=r.string("device", "cpu"),
            compute_type=r.string("compute_type", "int8"),
            beam_size=r.integer("beam_size", 5, lo=1, hi=16),
        )
        r.done()
    s.done()
    try:
        protocol.quality_env({}, whisper_model=whisper_model, audio_dir="x", device=device)
    except protocol.ProtocolError as exc:
        raise ConfigError(f"asr: {exc}") from None
    return QualityConfig(base, whisper_model, device, highest, rescore, speaker_model)
