"""vLLM-Omni plugin: stage 2 of MiniCPM-o 4.5 on this project's Code2Wav runtime.

Entry point (group ``vllm_omni.general_plugins``, loaded by vLLM-Omni in every process,
possibly more than once)::

    minicpm_speech_code2wav = "minicpm_speech_runtime.serving.plugin:register"

:func:`register` decides from the deploy config named by ``MINICPM_SPEECH_DEPLOY_CONFIG``
(exported by the supervisor): unless its Code2Wav connector extras say
``batched_code2wav: true`` it does nothing at all, and vLLM-Omni's own path runs untouched.
When on, it wraps two methods of vLLM-Omni's ``MiniCPMO45Code2Wav`` (the way vLLM-Omni's own
NPU patch wraps ``_build_backend``), once per process, guarded by a marker on the class:

* ``_build_backend``: after vLLM-Omni built its ``BatchedToken2Wav``, and only if this
  stage's own extras say ``batched_code2wav: true``, the backend becomes a
  :class:`~.backend.RuntimeBackend`: part 1's ahead-of-time reference preparation, metrics,
  and this project's batched engine (:class:`~.batched.EngineBackend`, configured from the
  extras by :func:`~.batched.engine_config`, which refuses what it cannot honour) behind the
  :class:`~.backend.Code2WavEngine` protocol; ``plugin.json`` is written to the control
  directory; with ``cfm_graph_precapture`` the engine's warm-up (graph precapture) runs and
  a stream of the model's default reference is decoded, and ``precapture.json`` reports it
  with the engine's graph stats (``done``/``failed``/``skipped``).
* ``_materialize_runtime_prompt``: once vLLM-Omni has written a request's reference WAV, the
  backend's ``submit_ahead`` starts preparing it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from .config import EXTRA_PATH
from .control import (
    DEPLOY_CONFIG_ENV,
    PLUGIN_FILE,
    PRECAPTURE_FILE,
    control_dir_from_env,
    write_json,
)

log = logging.getLogger(__name__)

CODE2WAV_MODULE = "vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav"
MARKER = "_minicpm_speech_runtime_patched"

_lock = threading.Lock()
_registered = False


def extras_from_env() -> dict[str, Any] | None:
    """The Code2Wav connector extras of the deploy config the supervisor exported."""
    path = os.environ.get(DEPLOY_CONFIG_ENV)
    if not path:
        return None
    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        log.warning("plugin: cannot read %s (%s); staying off", path, exc)
        return None
    node: Any = document
    for key in EXTRA_PATH:
        node = node.get(key) if isinstance(node, dict) else None
    return dict(node) if isinstance(node, dict) else {}


def enabled() -> bool:
    extras = extras_from_env()
    return bool(extras and extras.get("batched_code2wav", False))


def register() -> None:
    """The entry point: a no-op when off, when already done, or without vLLM-Omni."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    if not enabled():
        log.debug("plugin: batched_code2wav is off; vLLM-Omni's Code2Wav path is untouched")
        return
    try:
        import importlib

        module = importlib.import_module(CODE2WAV_MODULE)
    except ImportError as exc:
        log.warning("plugin: vLLM-Omni's MiniCPM-o Code2Wav is not importable (%s)", exc)
        return
    patch_code2wav(module.MiniCPMO45Code2Wav)


def patch_code2wav(cls: type) -> bool:
    """Wrap the two methods of ``cls``; False when they were already wrapped."""
    with _lock:
        if getattr(cls, MARKER, False):
            return False
        original_build = cls._build_backend  # type: ignore[attr-defined]
        original_materialize = cls._materialize_runtime_prompt  # type: ignore[attr-defined]

        def _build_backend(self: Any) -> None:
            original_build(self)
            install_runtime_backend(self)

        def _materialize_runtime_prompt(self: Any, ref_audio: Any, sample_rate: Any) -> Any:
            cache_key, entry = original_materialize(self, ref_audio, sample_rate)
            backend = self.backend
            submit = getattr(type(backend), "submit_ahead", None)
            if submit is not None:
                try:
                    backend.submit_ahead(entry.cache_id, entry.path)
                except Exception:  # preparation falls back inline at chunk 0
                    log.exception("plugin: ahead-of-time preparation not started")
            return cache_key, entry

        cls._build_backend = _build_backend  # type: ignore[attr-defined]
        cls._materialize_runtime_prompt = _materialize_runtime_prompt  # type: ignore[attr-defined]
        setattr(cls, MARKER, True)
        return True


def install_runtime_backend(model: Any) -> Any:
    """Put a :class:`RuntimeBackend` in front of ``model.backend`` if this stage asks for it."""
    from .backend import RuntimeBackend, RuntimeOptions

    inner = model.backend
    if inner is None or isinstance(inner, RuntimeBackend):
        return inner
    options = RuntimeOptions.from_extras(model._extra_config())
    if not options.batched_code2wav:
        return inner
    from .metrics import runtime_metrics

    extras = model._extra_config()
    device = inner.speech_window.device
    control = control_dir_from_env()
    try:
        engine, models = build_engine(model, extras, device, inner)
    except Exception as exc:
        if control is not None:
            write_json(control, PRECAPTURE_FILE, {
                "state": "failed", "reason": f"{type(exc).__name__}: {exc}"[:500]})
        raise
    backend = RuntimeBackend(
        engine=engine,
        options=options,
        prep=_voice_prep(model, models.tokenizer, options, device),
        make_features=_features_factory(),
        inline_prepare=inner.prepare_prompt,
        metrics=runtime_metrics(),
        device=device,
        streams=lambda: engine.num_streams,
    )
    _replace_backend(model, backend)
    if control is not None:
        write_json(control, PLUGIN_FILE, {"pid": os.getpid(), "options": options.as_dict()})
    _precapture(model, backend, options, control)
    return backend


def _replace_backend(model: Any, backend: Any) -> None:
    # MiniCPMO45Code2Wav is an nn.Module and its BatchedToken2Wav a registered child module:
    # nn.Module refuses a plain object under a child's name until the child is unregistered.
    # The inner backend stays reachable through ``backend`` (inline preparation, fallback
    # attributes); vLLM's loader audit counted the model's parameters before this build.
    modules = getattr(model, "_modules", None)
    if isinstance(modules, dict) and "backend" in modules:
        delattr(model, "backend")
    model.backend = backend


def build_engine(
    model: Any, extras: dict[str, Any], device: Any, inner: Any = None
) -> tuple[Any, Any]:
    """This project's batched engine on the stage's checkpoint; refuses unsupported extras.

    The engine loads its own copy of the Code2Wav weights from ``<model>/assets/token2wav``
    (vLLM-Omni's ``BatchedToken2Wav`` keeps its copy; nothing of it is driven any more).
    TF32 follows ``token2wav_allow_tf32`` (the engine sets it on CUDA).
    """
    from ..assets import load_code2wav
    from ..engine import Code2WavEngine
    from .batched import EngineBackend, engine_config

    config = engine_config(extras, device)
    models = load_code2wav(Path(model.model_path) / "assets" / "token2wav", device)
    return EngineBackend(Code2WavEngine(models, config), device, inner), models


def _features_factory() -> Any:
    from vllm_omni.model_executor.models.minicpmo_4_5.batched_token2wav import PromptFeatures

    def make(key: tuple[str, str], voice: Any) -> Any:
        return PromptFeatures(
            cache_key=key,
            speech_tokens=voice.prompt_tokens,
            speaker_embedding=voice.spk_emb,
            mels=voice.prompt_mels,
        )

    return make


def _voice_prep(model: Any, tokenizer: Any, options: Any, device: Any) -> Any:
    if options.reference_prep_workers <= 0:
        return None
    from ..campplus import load_campplus_onnx
    from ..device import DeviceHalf
    from ..prep import PrepConfig, VoicePrep
    from ..speaker import make_speaker
    from .backend import CAMPPLUS_BACKENDS

    onnx_path = Path(model.model_path) / "assets" / "token2wav" / "campplus.onnx"
    name = CAMPPLUS_BACKENDS[options.campplus_backend]
    module = load_campplus_onnx(onnx_path) if name == "torch" else None
    speaker = make_speaker(name, module, onnx_path, device)  # type: ignore[arg-type]
    return VoicePrep(
        DeviceHalf(tokenizer, speaker, device),
        PrepConfig(
            workers=options.reference_prep_workers,
            cache_size=max(1, options.reference_cache_size),
        ),
    )


def _precapture(model: Any, backend: Any, options: Any, control: Path | None) -> None:
    if not options.cfm_graph_precapture:
        document: dict[str, Any] = {"state": "skipped", "reason": "cfm_graph_precapture off"}
    else:
        begin = time.perf_counter()
        try:
            wav, cache_id = model._normalized_default_prompt()
            document = backend.precapture(cache_id, wav)
        except Exception as exc:
            log.exception("plugin: graph precapture failed")
            document = {
                "state": "failed",
                "reason": f"{type(exc).__name__}: {exc}"[:500],
                "seconds": round(time.perf_counter() - begin, 3),
            }
    if control is not None:
        write_json(control, PRECAPTURE_FILE, document)
