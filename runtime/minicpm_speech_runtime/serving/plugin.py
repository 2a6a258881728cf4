"""vLLM-Omni plugin: stage 2 of MiniCPM-o 4.5 on this project's Code2Wav runtime.

Entry point (group ``vllm_omni.general_plugins``, loaded by vLLM-Omni in every process,
possibly more than once)::

    minicpm_speech_code2wav = "minicpm_speech_runtime.serving.plugin:register"

:func:`register` decides from the deploy config named by ``MINICPM_SPEECH_DEPLOY_CONFIG``
(exported by the supervisor): unless its Code2Wav connector extras say
``batched_code2wav: true`` it does nothing at all, and vLLM-Omni's own path runs untouched.
When on, it wraps the methods :data:`WRAPPED` of vLLM-Omni's ``MiniCPMO45Code2Wav`` (the way
vLLM-Omni's own NPU patch wraps ``_build_backend``), once per process, guarded by a marker on
the class:

* ``_build_backend``: after vLLM-Omni built its ``BatchedToken2Wav``, and only if this
  stage's own extras say ``batched_code2wav: true``, the backend becomes a
  :class:`~.backend.Code2WavBackend` on this project's engine (configured from the extras by
  :func:`~.batched.engine_config`, which refuses what it cannot honour, with as many streams
  as the stage's ``max_num_seqs``). vLLM-Omni's ``BatchedToken2Wav`` is let go, so the Code2Wav
  weights are on the device once. ``plugin.json`` is written to the control directory; with
  ``cfm_graph_precapture`` the engine's warm-up (graph precapture) runs and a stream of the
  model's default reference is decoded, and ``precapture.json`` reports it.
* ``_iter_decode_batches``: vLLM-Omni's split of a forward's work into decode batches, handed
  whole to the backend's ``plan_forward`` before the first batch is decoded: one engine step
  per forward, across every voice.
* ``_materialize_runtime_prompt``: once vLLM-Omni has written a request's reference WAV, the
  backend's ``submit_ahead`` starts preparing it.
* ``_resolve_prompt``: a request whose reference voice vLLM-Omni's normalisation refuses gets
  a refused prompt instead of the raise that would end the stage (see below).
* ``forward`` and ``on_requests_finished``: held under the backend's ``model_lock``, one at a
  time.

In the API server's process (``vllm serve`` itself), a request's content is checked before it
enters the pipeline and a request error vLLM classifies as the client's is answered with its
4xx rather than vLLM-Omni's 500 (:mod:`.api_errors`, :mod:`.request_checks`). In the stages'
processes, a Thinker reply too short to speak ends its request without audio rather than the
Talker's stage (:mod:`.talker_handoff`).

A request whose reference voice stage 2 cannot use fails alone: the wrapped
``_resolve_prompt`` turns vLLM-Omni's own refusal of the voice (its normalisation raises, which
would end the stage-2 process) into a prompt the backend serves no audio, and the backend does
the same for a voice its preparation refuses; each such request is recorded for the API
server, which answers its client 400 (:mod:`.refusals`).

Preparation from arrival (:mod:`.arrivals`): in the API server's process the plugin wraps
vLLM-Omni's ``Orchestrator._prewarm_async_chunk_stages``, which runs when a request arrives
and is pre-submitted to the later stages; the request's reference voice, as vLLM-Omni's own
stage-0 bridge reads it from the prompt (``_extract_prompt_reference_audio``), is spooled under
the control directory. In stage 2 an :class:`~.arrivals.ArrivalWatcher` takes it and runs
vLLM-Omni's ``_materialize_runtime_prompt`` on it (which starts preparation), so chunk 0 finds
the voice prepared; vLLM-Omni's runtime-prompt cache (``token2wav_runtime_prompt_cache_size``)
keeps it until then. The watcher works beside the forward, not between two forwards: the
runtime-prompt table it shares with them becomes a
:class:`~.prompt_memo.LockedPromptTable`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from minicpm_speech_contract.extras import EXTRA_PATH, Code2WavExtras
from minicpm_speech_contract.paths import dig

from .arrivals import ARRIVALS_SUBDIR, Arrival, ArrivalWatcher, spool_reference
from .control import (
    DEPLOY_CONFIG_ENV,
    PLUGIN_FILE,
    PRECAPTURE_FILE,
    control_dir_from_env,
    write_json,
)
from .prompt_memo import LockedPromptTable, PromptMemo, raw_reference
from .refusals import IO_ERROR, REFUSALS_SUBDIR, REFUSED_PROMPT, record_refusal

log = logging.getLogger(__name__)

CODE2WAV_MODULE = "vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav"
MARKER = "_minicpm_speech_runtime_patched"
WRAPPED = ("_build_backend", "_iter_decode_batches", "_materialize_runtime_prompt",
           "_resolve_prompt", "forward", "on_requests_finished")
BATCH_ERROR = "MiniCPMO45Code2WavBatchError "
ORCHESTRATOR_MODULE = "vllm_omni.engine.orchestrator"
ORCHESTRATOR_WRAPPED = "_prewarm_async_chunk_stages"
STAGE_BRIDGE_MODULE = "vllm_omni.model_executor.stage_input_processors.minicpmo_4_5_omni"

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
    extras = dig(document, EXTRA_PATH)
    return dict(extras) if isinstance(extras, dict) else {}


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
    if multiprocessing.parent_process() is not None:  # a stage's process: the Talker may run
        try:
            from .talker_handoff import TALKER_MODULE, patch_talker

            patch_talker(importlib.import_module(TALKER_MODULE))
        except Exception as exc:  # a one-token reply still ends the Talker's stage
            log.warning("plugin: vLLM-Omni's Talker is not patched (%s)", str(exc)[:300])
    if multiprocessing.parent_process() is None:  # `vllm serve` itself: the API server
        try:
            from .api_errors import patch_api_server

            patch_api_server()
        except Exception as exc:  # requests are still served; client errors answer 500
            log.warning("plugin: vLLM-Omni's chat handler is not patched (%s)", str(exc)[:300])
    if Code2WavExtras.of(extras_from_env() or {}).reference_prep_workers <= 0:
        return  # no preparation pool in stage 2 to take arrivals
    try:
        orchestrator = importlib.import_module(ORCHESTRATOR_MODULE)
        patch_orchestrator(orchestrator.OrchestratorBase)
    except Exception as exc:  # stage 2 still prepares at chunk 0
        log.warning("plugin: vLLM-Omni's orchestrator is not patched (%s); reference voices "
                    "are prepared from stage 2's first window", str(exc)[:300])


def patch_code2wav(cls: type) -> bool:
    """Wrap the methods :data:`WRAPPED` of ``cls``; False when they were already wrapped."""
    from .backend import Code2WavBackend

    with _lock:
        if getattr(cls, MARKER, False):
            return False
        original_build = cls._build_backend  # type: ignore[attr-defined]
        original_materialize = cls._materialize_runtime_prompt  # type: ignore[attr-defined]
        original_batches = cls._iter_decode_batches  # type: ignore[attr-defined]

        def _build_backend(self: Any) -> None:
            # flow.yaml names its classes cosyvoice2.*, a module vLLM-Omni neither ships nor
            # aliases: the reference package's alias has to exist before vLLM-Omni loads it.
            from ..assets import ensure_cosyvoice2_alias

            ensure_cosyvoice2_alias()
            original_build(self)
            install_runtime_backend(self)

        def _iter_decode_batches(self: Any, buckets: Any) -> Any:
            batches = list(original_batches(self, buckets))
            if isinstance(self.backend, Code2WavBackend):
                self.backend.plan_forward(batches)
            return iter(batches)

        def _materialize_runtime_prompt(self: Any, ref_audio: Any, sample_rate: Any) -> Any:
            backend = self.backend
            if not isinstance(backend, Code2WavBackend):
                return original_materialize(self, ref_audio, sample_rate)
            # a voice normalised before (at its request's arrival, or sent again) is not
            # normalised and hashed again on the forward's path
            raw = raw_reference(ref_audio, sample_rate)
            known = None if raw is None else remembered_prompt(self, backend.prompt_memo, *raw)
            if known is None:
                known = original_materialize(self, ref_audio, sample_rate)
                if raw is not None:
                    backend.prompt_memo.remember(*raw, known[0])
            start_preparation(self, backend, *known)
            return known

        original_resolve = cls._resolve_prompt  # type: ignore[attr-defined]

        def _resolve_prompt(self: Any, state_id: Any, info: Any, meta: Any, previous: Any
                            ) -> Any:
            try:
                return original_resolve(self, state_id, info, meta, previous)
            except Exception as exc:
                if not isinstance(self.backend, Code2WavBackend) or not carries_reference(info):
                    raise
                return refuse_voice(str(state_id), exc)

        original_forward = cls.forward  # type: ignore[attr-defined]
        original_finished = cls.on_requests_finished  # type: ignore[attr-defined]

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _model_lock(self):
                return original_forward(self, *args, **kwargs)

        def on_requests_finished(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _model_lock(self):
                return original_finished(self, *args, **kwargs)

        cls.forward = forward  # type: ignore[attr-defined]
        cls.on_requests_finished = on_requests_finished  # type: ignore[attr-defined]
        cls._build_backend = _build_backend  # type: ignore[attr-defined]
        cls._iter_decode_batches = _iter_decode_batches  # type: ignore[attr-defined]
        cls._materialize_runtime_prompt = _materialize_runtime_prompt  # type: ignore[attr-defined]
        cls._resolve_prompt = _resolve_prompt  # type: ignore[attr-defined]
        setattr(cls, MARKER, True)
        return True


def carries_reference(info: Any) -> bool:
    """Whether a request's window carries a reference voice, where vLLM-Omni reads one."""
    codes = info.get("codes") if isinstance(info, Mapping) else None
    return isinstance(codes, Mapping) and codes.get("ref") is not None


def refuse_voice(request_id: str, exc: Exception) -> tuple[str, str, None]:
    """The prompt of a request whose reference voice vLLM-Omni could not normalise: the request
    gets no audio (the backend refuses the prompt) and the API server is told, so its client
    gets an error, while the rest of the forward goes on. vLLM-Omni would raise, ending the
    stage-2 process and every stream on the pod."""
    reason = refusal_reason(exc)
    message = f"stage 2 could not use the reference voice ({reason}): {exc}"[:300]
    log.warning("Code2Wav request %s refused: %s", request_id[:100], message)
    control = control_dir_from_env()
    if control is not None:
        record_refusal(control / REFUSALS_SUBDIR, request_id, reason, message)
    return f"{REFUSED_PROMPT}{reason}", "", None


def refusal_reason(exc: Exception) -> str:
    """vLLM-Omni's reason code of a batch error (``non_finite_ref_audio``), ``io-error`` for a
    fault of the stage's own disk, else the exception's type."""
    text = str(exc)
    if isinstance(exc, RuntimeError) and text.startswith(BATCH_ERROR):
        with contextlib.suppress(ValueError):
            payload = json.loads(text[len(BATCH_ERROR):])
            reason = payload.get("reason") if isinstance(payload, dict) else None
            if isinstance(reason, str):
                return reason[:80]
    if isinstance(exc, OSError):
        return IO_ERROR
    return type(exc).__name__[:80]


def remembered_prompt(
    model: Any, memo: PromptMemo, samples: Any, rate: int
) -> tuple[str, Any] | None:
    """vLLM-Omni's ``(cache_key, entry)`` for a reference it already normalised, as its own
    ``_materialize_runtime_prompt`` returns an existing entry (moved to the recent end of its
    table); None when the memo does not know these samples or vLLM-Omni let the entry go."""
    cache_key = memo.lookup(samples, rate)
    if cache_key is None:
        return None
    prompts = getattr(model, "_runtime_prompts", None)
    if not isinstance(prompts, OrderedDict):
        return None
    entry = prompts.get(cache_key)
    if entry is None or not Path(entry.path).is_file():
        return None
    try:
        prompts.move_to_end(cache_key)
    except KeyError:  # evicted by the other thread since: vLLM-Omni writes it again
        return None
    return cache_key, entry


def start_preparation(model: Any, backend: Any, cache_key: str, entry: Any) -> None:
    """Hand a normalised voice to preparation, under the model lock: only a forward or
    ``on_requests_finished`` evicts a runtime prompt (and releases its preparation), so a voice
    the arrival watcher normalised beside a forward is handed over after that forward, and
    only if vLLM-Omni still holds it; otherwise its job would pin a voice nobody releases."""
    with _model_lock(model):
        prompts = getattr(model, "_runtime_prompts", None)
        if isinstance(prompts, OrderedDict) and prompts.get(cache_key) is not entry:
            return  # evicted meanwhile: its first window prepares it, if it comes
        try:
            backend.submit_ahead(entry.cache_id, entry.path)
        except Exception:  # preparation falls back inline at chunk 0
            log.exception("plugin: ahead-of-time preparation not started")


def _model_lock(model: Any) -> Any:
    backend = getattr(model, "backend", None)
    lock = getattr(backend, "model_lock", None)
    return lock if lock is not None else contextlib.nullcontext()


def patch_orchestrator(cls: type) -> bool:
    """Spool each arriving request's reference voice; False when already wrapped."""
    with _lock:
        if getattr(cls, MARKER, False):
            return False
        original = getattr(cls, ORCHESTRATOR_WRAPPED)

        async def _prewarm_async_chunk_stages(
            self: Any, request_id: Any, stage0_request: Any, req_state: Any, *args: Any,
            **kwargs: Any,
        ) -> Any:
            if int(getattr(req_state, "final_stage_id", 0) or 0) > 0:
                spool_arrival(str(request_id), getattr(req_state, "prompt", None))
            return await original(self, request_id, stage0_request, req_state, *args, **kwargs)

        setattr(cls, ORCHESTRATOR_WRAPPED, _prewarm_async_chunk_stages)
        setattr(cls, MARKER, True)
        return True


def arrivals_dir() -> Path | None:
    control = control_dir_from_env()
    return None if control is None else control / ARRIVALS_SUBDIR


def spool_arrival(request_id: str, prompt: Any) -> Path | None:
    """Spool the reference voice vLLM-Omni's stage-0 bridge will read from ``prompt``; never
    raises (a request without one, or any failure, leaves preparation to chunk 0)."""
    spool = arrivals_dir()
    if spool is None or prompt is None:
        return None
    try:
        import importlib

        bridge = importlib.import_module(STAGE_BRIDGE_MODULE)
        reference = bridge._extract_prompt_reference_audio(prompt)
        if reference is None:
            return None
        waveform, sample_rate = reference
        return spool_reference(spool, request_id, waveform.detach().cpu().numpy(),
                               int(sample_rate))
    except Exception as exc:
        log.warning("plugin: reference of request %s not spooled (%s)", request_id[:100],
                    f"{type(exc).__name__}: {exc}"[:300])
        return None


def take_arrival(model: Any, backend: Any, arrival: Arrival) -> None:
    """Stage 2's side of an arrival: vLLM-Omni's own normalisation and runtime prompt, which
    the wrapped ``_materialize_runtime_prompt`` hands to preparation (:func:`start_preparation`).
    With vLLM-Omni's table shared (:func:`share_prompt_table`) the normalisation runs beside a
    forward, since the memo and the arrival record take their own locks; otherwise it takes
    turns with the forward on the model lock."""
    import torch

    shared = isinstance(getattr(model, "_runtime_prompts", None), LockedPromptTable)
    with contextlib.nullcontext() if shared else backend.model_lock:
        _, entry = model._materialize_runtime_prompt(
            torch.from_numpy(arrival.samples), arrival.sample_rate)
    backend.note_arrival(entry.cache_id, arrival.arrived_at)


def share_prompt_table(model: Any) -> bool:
    """Put a :class:`LockedPromptTable` holding vLLM-Omni's runtime prompts in its place;
    False when the model has no such table (a vLLM-Omni this plugin does not know)."""
    prompts = getattr(model, "_runtime_prompts", None)
    if isinstance(prompts, LockedPromptTable):
        return True
    if not isinstance(prompts, OrderedDict):
        return False
    model._runtime_prompts = LockedPromptTable(prompts)
    return True


def install_runtime_backend(model: Any) -> Any:
    """Put a :class:`Code2WavBackend` in place of ``model.backend`` if this stage asks for it."""
    from .backend import Code2WavBackend

    inner = model.backend
    if inner is None or isinstance(inner, Code2WavBackend):
        return inner
    extras = model._extra_config()
    options = Code2WavExtras.of(extras)
    if not options.batched_code2wav:
        return inner
    device = inner.speech_window.device
    control = control_dir_from_env()
    try:
        # vLLM builds a stage under its model dtype as torch's default (bfloat16 for a
        # bfloat16 or `dtype: auto` checkpoint); the engine and the speech tokenizer are
        # float32 models, as vLLM-Omni's own Token2wav build makes them.
        with float32_default():
            backend = build_backend(model, extras, options, device)
    except Exception as exc:
        if control is not None:
            write_json(control, PRECAPTURE_FILE, {
                "state": "failed", "reason": f"{type(exc).__name__}: {exc}"[:500]})
        raise
    runner = backend.engine.runner
    weights = {
        "vllm_omni_freed": module_bytes(inner, device),
        "engine": module_bytes(runner.flow, device) + module_bytes(runner.vocoder.hift, device),
    }
    _replace_backend(model, backend)
    del inner
    if control is not None:
        backend.on_refused = lambda request_id, message: record_refusal(
            control / REFUSALS_SUBDIR, request_id, "voice",
            f"stage 2 could not use the reference voice: {message}")
    prompts = getattr(model, "_runtime_prompt_cache_size", 0)
    if isinstance(prompts, int):  # as many raw voices as vLLM-Omni keeps prompts, and streams
        streams = backend.engine.config.max_streams
        backend.prompt_memo = PromptMemo(max_entries=max(16, prompts + streams))
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()
    if control is not None:
        write_json(control, PLUGIN_FILE, {
            "pid": os.getpid(),
            "options": options.as_dict(),
            "max_streams": backend.engine.config.max_streams,
            "weight_bytes": weights,
        })
    _precapture(model, backend, options, control)
    if control is not None and backend.prep is not None:
        share_prompt_table(model)
        _warn_small_prompt_cache(model, backend.engine.config.max_streams)
        backend.arrival_watcher = ArrivalWatcher(
            control / ARRIVALS_SUBDIR,
            lambda arrival: take_arrival(model, backend, arrival),
            backend.metrics.arrival,
        ).start()
    return backend


@contextlib.contextmanager
def float32_default() -> Iterator[None]:
    """torch's default dtype is float32 inside, and what it was after."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _warn_small_prompt_cache(model: Any, max_streams: int) -> None:
    size = getattr(model, "_runtime_prompt_cache_size", None)
    if isinstance(size, int) and size < 2 * max_streams:
        log.warning(
            "plugin: token2wav_runtime_prompt_cache_size=%d holds fewer reference voices than "
            "twice stage 2's %d streams; voices prepared at arrival may be evicted before "
            "their first window (set it to at least %d)", size, max_streams, 2 * max_streams)


def module_bytes(module: Any, device: Any) -> int:
    """Bytes of a module's parameters and buffers that live on ``device``."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors if t.device == device)


def _replace_backend(model: Any, backend: Any) -> None:
    # MiniCPMO45Code2Wav is an nn.Module and its BatchedToken2Wav a registered child module:
    # nn.Module refuses a plain object under a child's name until the child is unregistered.
    # Nothing keeps vLLM-Omni's backend afterwards, so its weights are freed; vLLM's loader
    # audit counted the model's parameters before this build.
    modules = getattr(model, "_modules", None)
    if isinstance(modules, dict) and "backend" in modules:
        delattr(model, "backend")
    model.backend = backend


def stage_max_num_seqs(model: Any) -> int | None:
    """Stage 2's ``max_num_seqs`` from the vLLM config the model was built with."""
    scheduler = getattr(getattr(model, "vllm_config", None), "scheduler_config", None)
    value = getattr(scheduler, "max_num_seqs", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def build_backend(model: Any, extras: dict[str, Any], options: Any, device: Any) -> Any:
    """This project's engine on the stage's checkpoint behind a :class:`Code2WavBackend`;
    refuses unsupported extras. The engine loads the Code2Wav weights from
    ``<model>/assets/token2wav``; TF32 follows ``token2wav_allow_tf32``."""
    from ..assets import drop_reference_stream_caches, load_code2wav
    from ..engine import Code2WavEngine
    from ..voice.host import prepare_host
    from .backend import Code2WavBackend
    from .batched import engine_config
    from .metrics import runtime_metrics

    config = engine_config(extras, device, max_streams=stage_max_num_seqs(model))
    folder = Path(model.model_path) / "assets" / "token2wav"
    models = load_code2wav(folder, device)
    drop_reference_stream_caches(models.flow)
    half = _device_half(folder, models.tokenizer, options, device)
    make_features = _features_factory()

    def inline_prepare(prompt_cache_id: str, prompt_wav: str) -> Any:
        voice = half.run(prepare_host(Path(prompt_wav).read_bytes(), models.up_rate))
        return make_features((prompt_cache_id, prompt_wav), voice)

    prep = None
    if options.reference_prep_workers > 0:
        from ..voice.prep import PrepConfig, VoicePrep

        prep = VoicePrep(half, PrepConfig(
            workers=options.reference_prep_workers,
            cache_size=max(1, options.reference_cache_size),
        ))
    return Code2WavBackend(
        Code2WavEngine(models, config), options, runtime_metrics(), device, make_features,
        inline_prepare, prep,
    )


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


def _device_half(folder: Path, tokenizer: Any, options: Any, device: Any) -> Any:
    from ..voice.campplus import load_campplus_onnx
    from ..voice.device import DeviceHalf
    from ..voice.speaker import make_speaker
    from .backend import CAMPPLUS_BACKENDS

    onnx_path = folder / "campplus.onnx"
    name = CAMPPLUS_BACKENDS[options.campplus_backend]
    module = load_campplus_onnx(onnx_path) if name == "torch" else None
    speaker = make_speaker(name, module, onnx_path, device)  # type: ignore[arg-type]
    return DeviceHalf(tokenizer, speaker, device)


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
