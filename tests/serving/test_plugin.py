"""The plugin without vLLM-Omni installed: a stand-in of ``MiniCPMO45Code2Wav`` with the same
method names, real voice preparation on a tiny random checkpoint (CPU)."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import importlib
import sys
import threading
import types
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import yaml
from minicpm_speech_runtime.serving import control, plugin
from minicpm_speech_runtime.serving.arrivals import spool_reference
from minicpm_speech_runtime.serving.backend import VLLM_OMNI_READS, Code2WavBackend
from minicpm_speech_runtime.serving.prompt_memo import LockedPromptTable
from minicpm_speech_runtime.voice.wav import encode_wav_pcm16

FEATURES_MODULE = "vllm_omni.model_executor.models.minicpmo_4_5.batched_token2wav"
MAIN = threading.main_thread()


@dataclass(frozen=True)
class PromptFeatures:  # vLLM-Omni's fields
    cache_key: tuple[str, str]
    speech_tokens: torch.Tensor
    speaker_embedding: torch.Tensor
    mels: torch.Tensor


@dataclass
class _Entry:
    cache_id: str
    path: str


class FakeEngine(torch.nn.Module):
    """``BatchedToken2Wav``'s surface, recording calls; like it, an ``nn.Module``."""

    alive: ClassVar[weakref.WeakSet[FakeEngine]] = weakref.WeakSet()

    def __init__(self, tokenizer: torch.nn.Module) -> None:
        super().__init__()
        FakeEngine.alive.add(self)
        self.speech_window = torch.zeros(4)
        self._token2wav = types.SimpleNamespace(
            _core=types.SimpleNamespace(_audio_tokenizer=tokenizer)
        )
        self.calls: list[tuple[str, Any]] = []

    def prepare_prompt(self, cache_id: str, wav: str) -> Any:
        self.calls.append(("prepare", cache_id))
        return ("inline-features", cache_id)

    def setup_batch(self, features: Any, n: int) -> list[Any]:
        self.calls.append(("setup", n))
        return [object() for _ in range(n)]

    def decode_batch(self, tokens: torch.Tensor, features: Any, states: list[Any], *,
                     last_chunk: bool) -> tuple[list[torch.Tensor], list[Any]]:
        self.calls.append(("decode", tuple(tokens.shape)))
        return [torch.zeros(10) for _ in states], [object() for _ in states]

    def decode_ragged_batch(self, tokens: list[torch.Tensor], features: Any, states: list[Any],
                            *, last_chunks: list[bool]) -> tuple[list[Any], list[Any]]:
        return [torch.zeros(10) for _ in states], list(states)

    def evict_prompt(self, cache_id: str, wav: str) -> None:
        self.calls.append(("evict", cache_id))


def make_fake_class(tokenizer: torch.nn.Module) -> type:
    class FakeCode2Wav(torch.nn.Module):
        # An nn.Module, as vLLM-Omni's is: its backend becomes a registered child module.
        builds = 0

        def __init__(self, extras: dict[str, Any], model_path: Path, refs: dict[str, bytes],
                     spool: Path, max_num_seqs: int = 8) -> None:
            super().__init__()
            self.backend: Any = None
            self.vllm_config = types.SimpleNamespace(
                scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs))
            self._extras, self.model_path = extras, str(model_path)
            self._states: dict[str, Any] = {}
            self.refs, self.spool = refs, spool
            self.materialized: list[str] = []
            self.calls: list[tuple[str, Any]] = []
            self.normalising: threading.Event | None = None
            self.hold_arrivals = threading.Event()

        def _extra_config(self) -> dict[str, Any]:
            return dict(self._extras)

        def _build_backend(self) -> None:
            type(self).builds += 1
            if self.backend is None:
                self.backend = FakeEngine(tokenizer)

        def _iter_decode_batches(self, buckets: Any) -> Any:
            yield from buckets

        def _materialize_runtime_prompt(self, ref_audio: Any, sample_rate: int) -> Any:
            if self.normalising is not None and threading.current_thread() is not MAIN:
                self.normalising.set()  # the arrival watcher is in vLLM-Omni's normalisation
                assert self.hold_arrivals.wait(30)
            if isinstance(ref_audio, torch.Tensor):  # a voice spooled at arrival
                data = encode_wav_pcm16(ref_audio.numpy(), sample_rate)
                ref_audio = hashlib.sha256(data).hexdigest()[:12]
                self.refs[ref_audio] = data
            path = self.spool / f"{ref_audio}.wav"
            path.write_bytes(self.refs[ref_audio])
            self.materialized.append(ref_audio)
            entry = _Entry(f"runtime-ref-{ref_audio}", str(path))
            table = getattr(self, "_runtime_prompts", None)
            if table is not None:  # vLLM-Omni's table, as its own method keeps it
                found = table.get(ref_audio)
                if found is None:
                    table[ref_audio] = entry
                else:
                    entry = found
                    table.move_to_end(ref_audio)
            return ref_audio, entry

        def _resolve_prompt(self, state_id: str, info: Any, meta: Any, previous: Any) -> Any:
            # vLLM-Omni's: a window carrying a reference is normalised, and its refusal raised
            ref = info.get("codes", {}).get("ref")
            if meta.get("stale"):
                raise RuntimeError('MiniCPMO45Code2WavBatchError {"reason": "stale_cache_epoch"}')
            if ref is None:
                return "default-ref", "default.wav", None
            if ref == "nan":
                raise RuntimeError(
                    'MiniCPMO45Code2WavBatchError {"reason": "non_finite_ref_audio"}')
            key, entry = self._materialize_runtime_prompt(ref, meta.get("ref_audio_sr"))
            return entry.cache_id, entry.path, key

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.calls.append(("forward", args))

        def on_requests_finished(self, finished: Any) -> None:
            self.calls.append(("finished", finished))

        def _normalized_default_prompt(self) -> tuple[str, str]:
            path = self.spool / "default.wav"
            path.write_bytes(self.refs["default"])
            return str(path), "default-ref"

    return FakeCode2Wav


@pytest.fixture
def fake_vllm_omni(models: Any, monkeypatch: pytest.MonkeyPatch) -> type:
    cls = make_fake_class(models.tokenizer)
    code2wav = types.ModuleType(plugin.CODE2WAV_MODULE)
    code2wav.MiniCPMO45Code2Wav = cls  # type: ignore[attr-defined]
    features = types.ModuleType(FEATURES_MODULE)
    features.PromptFeatures = PromptFeatures  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, plugin.CODE2WAV_MODULE, code2wav)
    monkeypatch.setitem(sys.modules, FEATURES_MODULE, features)
    monkeypatch.setattr(plugin, "_registered", False)
    return cls


def _deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: Any) -> dict[str, Any]:
    extras = {"batched_code2wav": True, "micro_batch_size": 2, "setup_graph_batch_sizes": [1, 2],
              "cfm_graph_precapture": True, "reference_prep_workers": 2,
              "reference_cache_size": 4, "campplus_backend": "onnxruntime", **extra}
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump({"connectors": {"connector_of_shared_memory": {
        "extra": extras}}}))
    monkeypatch.setenv(control.DEPLOY_CONFIG_ENV, str(path))
    monkeypatch.setenv(control.CONTROL_DIR_ENV, str(tmp_path / "control"))
    return extras


@pytest.fixture
def model_dir(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    (folder / "assets").mkdir(parents=True)
    (folder / "assets" / "token2wav").symlink_to(tiny_checkpoint)
    return folder


def test_off_without_deploy_config_is_a_no_op(
    fake_vllm_omni: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(control.DEPLOY_CONFIG_ENV, raising=False)
    before = dict(vars(fake_vllm_omni))
    plugin.register()
    plugin.register()
    assert dict(vars(fake_vllm_omni)) == before
    assert not hasattr(fake_vllm_omni, plugin.MARKER)


def test_off_in_deploy_config_is_a_no_op(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _deploy(tmp_path, monkeypatch, batched_code2wav=False)
    before = dict(vars(fake_vllm_omni))
    plugin.register()
    assert dict(vars(fake_vllm_omni)) == before


def test_without_vllm_omni_register_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _deploy(tmp_path, monkeypatch)
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setitem(sys.modules, plugin.CODE2WAV_MODULE, None)  # import fails
    plugin.register()  # logs, raises nothing


def test_on_patches_once_even_when_loaded_twice(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _deploy(tmp_path, monkeypatch)
    plugin.register()
    build = fake_vllm_omni._build_backend
    plugin.register()
    # A second import of the plugin module (fresh globals) still finds the class marker.
    reloaded = importlib.reload(plugin)
    reloaded.register()
    assert fake_vllm_omni._build_backend is build
    assert getattr(fake_vllm_omni, plugin.MARKER) is True
    assert reloaded.patch_code2wav(fake_vllm_omni) is False


def test_stage_with_option_off_keeps_vllm_omni_backend(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    _deploy(tmp_path, monkeypatch)
    plugin.register()
    model = fake_vllm_omni({"batched_code2wav": False}, model_dir, {}, tmp_path)
    model._build_backend()
    assert isinstance(model.backend, FakeEngine)
    assert not (tmp_path / "control" / control.PLUGIN_FILE).exists()


def test_on_wires_ahead_of_time_preparation_and_precapture(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path,
    models: Any,
) -> None:
    from minicpm_speech_runtime.fixtures.synth import wav_bytes
    from minicpm_speech_runtime.voice.device import DeviceHalf
    from minicpm_speech_runtime.voice.host import prepare_host
    from minicpm_speech_runtime.voice.speaker import make_speaker

    extras = _deploy(tmp_path, monkeypatch)
    plugin.register()
    refs = {"default": wav_bytes(2.0, 24000, seed=1), "a": wav_bytes(2.5, 16000, seed=2),
            "b": wav_bytes(3.0, 22050, seed=3)}
    model = fake_vllm_omni(extras, model_dir, refs, tmp_path, max_num_seqs=6)
    model._build_backend()
    model._build_backend()  # vLLM-Omni may call it again: nothing changes
    backend = model.backend
    assert isinstance(backend, Code2WavBackend)
    assert all(callable(getattr(backend, name)) for name in VLLM_OMNI_READS)
    assert fake_vllm_omni.builds == 2
    # vLLM-Omni's own backend is let go: the Code2Wav weights are held once, by the engine.
    gc.collect()
    assert not list(FakeEngine.alive) and "backend" not in model._modules
    written = control.read_json(tmp_path / "control", control.PLUGIN_FILE)
    assert written is not None and written["options"]["micro_batch_size"] == 2
    assert written["max_streams"] == 6  # the stage's max_num_seqs
    # the engine's flow and HiFT, without the reference's own streaming caches
    flow = backend.engine.runner.flow
    assert written["weight_bytes"]["engine"] == sum(
        t.numel() * t.element_size()
        for m in (flow, backend.engine.runner.vocoder.hift)
        for t in (*m.parameters(), *m.buffers()))
    assert flow.decoder.att_cache_buffer.numel() == 0
    assert flow.decoder.estimator.att_cache_buffer.numel() == 0
    pre = control.read_json(tmp_path / "control", control.PRECAPTURE_FILE)
    assert pre is not None and pre["state"] == "done"
    # Setup and decode run on this project's batched engine, configured from the extras;
    # precapture ran its warm-up and one stream of the default voice (2 chunks).
    engine = backend.engine
    assert engine.config.micro_batch == 2 and engine.config.precapture
    assert engine.config.max_streams == 6
    assert engine.counters.chunks == 2 and engine.counters.ended["done"] == 1
    assert pre["graph_stats"] == engine.graph_stats()

    # A request's reference: submitted when vLLM-Omni writes it, acquired at chunk 0.
    _, entry = model._materialize_runtime_prompt("a", 16000)
    assert backend.prep.wait_idle(60)
    features = backend.prepare_prompt(entry.cache_id, entry.path)
    assert backend.prep.counters.snapshot()["ahead"] == 1
    cpu = torch.device("cpu")
    expected = DeviceHalf(models.tokenizer,
                          make_speaker("onnxruntime", models.campplus, models.campplus_onnx, cpu),
                          cpu).run(prepare_host(refs["a"]))
    assert isinstance(features, PromptFeatures)
    assert features.cache_key == (entry.cache_id, entry.path)
    assert torch.equal(features.speech_tokens, expected.prompt_tokens)
    assert torch.equal(features.speaker_embedding, expected.spk_emb)
    assert torch.equal(features.mels, expected.prompt_mels)
    assert backend.prepare_prompt(entry.cache_id, entry.path) is features  # once per voice

    # A reference chunk 0 reaches before its job ran: late or ahead, never lost.
    _, entry_b = model._materialize_runtime_prompt("b", 22050)
    backend.prepare_prompt(entry_b.cache_id, entry_b.path)
    snap = backend.prep.counters.snapshot()
    assert snap["ahead"] + snap["late"] == 2

    # vLLM-Omni evicts the prompts: the pool lets go.
    for e in (entry, entry_b):
        backend.evict_prompt(e.cache_id, e.path)
    backend.prep.wait_idle(60)
    assert backend.prep.live_spool_files() == []
    # Only the default voice stays pinned: vLLM-Omni never evicts its default prompt.
    assert list(backend.prep.pins().values()) == [{"default-ref"}]
    backend.close()


def test_a_voice_vllm_omni_refuses_is_a_refused_prompt_not_a_raise(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path,
) -> None:
    """vLLM-Omni's ``_resolve_prompt`` raises for a voice its normalisation refuses, which would
    end the stage; wrapped, the request gets a prompt the backend serves no audio, and its
    refusal is recorded under its id for the API server. A failure with no voice to blame is
    still raised."""
    from minicpm_speech_runtime.fixtures.synth import wav_bytes
    from minicpm_speech_runtime.serving.backend import RefusedVoice
    from minicpm_speech_runtime.serving.refusals import take_refusal

    extras = _deploy(tmp_path, monkeypatch, cfm_graph_precapture=False)
    plugin.register()
    model = fake_vllm_omni(extras, model_dir, {"default": wav_bytes(2.0, 24000, seed=1)},
                           tmp_path)
    model._build_backend()
    backend = model.backend
    info = {"codes": {"ref": "nan"}}
    cache_id, wav, key = model._resolve_prompt("chatcmpl-7-abcdefgh", info, {}, None)
    refused = backend.prepare_prompt(cache_id, wav)
    assert isinstance(refused, RefusedVoice) and "non_finite_ref_audio" in refused.reason
    assert key is None, "nothing of vLLM-Omni's runtime-prompt table stands behind it"
    record = take_refusal(tmp_path / "control" / "refusals", "chatcmpl-7")
    assert record is not None and record.reason == "non_finite_ref_audio"
    assert all(h.finished for h in backend.setup_batch(refused, 2))
    monkeypatch.setattr(fake_vllm_omni, "_materialize_runtime_prompt",
                        lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(RuntimeError, match="stale_cache_epoch"):  # no voice to blame
        model._resolve_prompt("chatcmpl-8", {"codes": {}}, {"stale": True}, None)
    model._resolve_prompt("chatcmpl-9", {"codes": {"ref": "a"}}, {}, None)
    io = take_refusal(tmp_path / "control" / "refusals", "chatcmpl-9")
    assert io is not None and io.reason == "io-error"
    backend.close()


def test_the_engine_is_built_in_float32_whatever_the_stages_default_dtype(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path,
) -> None:
    """vLLM builds a stage with its model dtype as torch's default (bfloat16 for `dtype:
    auto` on a bfloat16 checkpoint). The engine, the speech tokenizer and CAM++ are float32
    models: built in bfloat16 the first reference failed with a dtype mismatch."""
    from minicpm_speech_runtime.fixtures.synth import wav_bytes

    extras = _deploy(tmp_path, monkeypatch, cfm_graph_precapture=False)
    plugin.register()
    refs = {"default": wav_bytes(2.0, 24000, seed=1), "a": wav_bytes(2.5, 16000, seed=2)}
    model = fake_vllm_omni(extras, model_dir, refs, tmp_path)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model._build_backend()
        assert torch.get_default_dtype() == torch.bfloat16  # the stage's default is left as is
        backend = model.backend
        assert isinstance(backend, Code2WavBackend)
        runner = backend.engine.runner
        dtypes = {p.dtype for m in (runner.flow, runner.vocoder.hift) for p in m.parameters()}
        assert dtypes == {torch.float32}
        _, entry = model._materialize_runtime_prompt("a", 16000)
        features = backend.prepare_prompt(entry.cache_id, entry.path)
        assert features.mels.dtype == torch.float32 and features.mels.numel() > 0
    finally:
        torch.set_default_dtype(previous)
        if isinstance(model.backend, Code2WavBackend):
            model.backend.close()


def test_unsupported_extras_refused_at_build(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    extras = _deploy(tmp_path, monkeypatch, token2wav_float16=True)
    plugin.register()
    model = fake_vllm_omni(extras, model_dir, {}, tmp_path)
    with pytest.raises(ValueError, match="token2wav_float16=true is not supported") as info:
        model._build_backend()
    assert "\n" not in str(info.value)
    pre = control.read_json(tmp_path / "control", control.PRECAPTURE_FILE)
    assert pre is not None and pre["state"] == "failed" and "token2wav_float16" in pre["reason"]
    assert not (tmp_path / "control" / control.PLUGIN_FILE).exists()


def _fake_pipeline(monkeypatch: pytest.MonkeyPatch) -> type:
    """vLLM-Omni's orchestrator and stage-0 bridge, the two names the plugin uses of them."""

    class OrchestratorBase:
        def __init__(self) -> None:
            self.prewarmed: list[str] = []

        async def _prewarm_async_chunk_stages(
            self, request_id: str, stage0_request: Any, req_state: Any
        ) -> bool:
            self.prewarmed.append(request_id)
            return True

    def extract(prompt: Any) -> Any:  # the bridge's reading of a serving prompt
        ref = prompt.get("_minicpmo45_reference_audio") if isinstance(prompt, dict) else None
        return None if ref is None else (torch.as_tensor(ref[0], dtype=torch.float32), ref[1])

    class Orchestrator(OrchestratorBase):  # the class vLLM-Omni instantiates
        pass

    orchestrator = types.ModuleType(plugin.ORCHESTRATOR_MODULE)
    orchestrator.OrchestratorBase = OrchestratorBase  # type: ignore[attr-defined]
    orchestrator.Orchestrator = Orchestrator  # type: ignore[attr-defined]
    bridge = types.ModuleType(plugin.STAGE_BRIDGE_MODULE)
    bridge._extract_prompt_reference_audio = extract  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, plugin.ORCHESTRATOR_MODULE, orchestrator)
    monkeypatch.setitem(sys.modules, plugin.STAGE_BRIDGE_MODULE, bridge)
    return Orchestrator


def _until(predicate: Any, timeout: float = 30.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def test_a_voice_spooled_at_arrival_is_prepared_before_its_first_window(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    from minicpm_speech_runtime.fixtures.synth import voice_like, wav_bytes
    from prometheus_client import REGISTRY

    orchestrator_cls = _fake_pipeline(monkeypatch)
    extras = _deploy(tmp_path, monkeypatch)
    plugin.register()
    model = fake_vllm_omni(extras, model_dir, {"default": wav_bytes(2.0, 24000, seed=1)},
                           tmp_path, max_num_seqs=4)
    model._build_backend()
    backend = model.backend
    assert isinstance(backend, Code2WavBackend) and backend.arrival_watcher is not None
    lead = "minicpm_speech_reference_arrival_to_{}_seconds_{}"
    before = {k: REGISTRY.get_sample_value(lead.format(k, "sum")) or 0.0
              for k in ("prepared", "first_window")}
    try:
        voice = voice_like(2.5, 16000, seed=21)
        orchestrator = orchestrator_cls()
        arrive = orchestrator._prewarm_async_chunk_stages
        prompt = {"prompt_token_ids": [1, 2], "_minicpmo45_reference_audio": (voice, 16000)}
        # A text-only request (no later stage) and one without a voice are not spooled.
        asyncio.run(arrive("text-only", None, types.SimpleNamespace(final_stage_id=0,
                                                                    prompt=prompt)))
        asyncio.run(arrive("no-voice", None, types.SimpleNamespace(final_stage_id=2,
                                                                   prompt={"x": 1})))
        asyncio.run(arrive("req-1", None, types.SimpleNamespace(final_stage_id=2,
                                                                prompt=prompt)))
        assert orchestrator.prewarmed == ["text-only", "no-voice", "req-1"]  # always handed on
        # Stage 2 takes the spooled voice through vLLM-Omni's normalisation and prepares it,
        # with no window of the request in sight yet.
        assert _until(lambda: len(model.materialized) == 1)
        assert backend.prep is not None and backend.prep.wait_idle(60)
        assert list((tmp_path / "control" / "arrivals").glob("*.ref")) == []
        # Its first window: vLLM-Omni materialises the same voice and chunk 0 acquires it.
        _, entry = model._materialize_runtime_prompt(torch.from_numpy(voice), 16000)
        assert model.materialized[0] == model.materialized[1]
        was = backend.prep.counters.snapshot()
        backend.prepare_prompt(entry.cache_id, entry.path)
        now = backend.prep.counters.snapshot()
        assert {k: now[k] - was[k] for k in now if now[k] != was[k]} == {"ahead": 1}
        after = {k: REGISTRY.get_sample_value(lead.format(k, "sum")) or 0.0
                 for k in ("prepared", "first_window")}
        to_prepared = after["prepared"] - before["prepared"]
        to_first_window = after["first_window"] - before["first_window"]
        assert 0.0 < to_prepared < to_first_window
    finally:
        backend.close()
    assert not backend.arrival_watcher._thread.is_alive()


def test_the_models_step_and_its_finished_requests_take_turns(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    """The model's forward and ``on_requests_finished`` run one at a time, whichever threads
    call them."""
    from minicpm_speech_runtime.fixtures.synth import wav_bytes

    extras = _deploy(tmp_path, monkeypatch)
    plugin.register()
    model = fake_vllm_omni(extras, model_dir, {"default": wav_bytes(2.0, 24000, seed=1)},
                           tmp_path)
    model._build_backend()
    backend = model.backend
    try:
        backend.model_lock.acquire()
        runs = [threading.Thread(target=model.forward, args=(1,)),
                threading.Thread(target=model.on_requests_finished, args=({"r"},))]
        for t in runs:
            t.start()
        runs[0].join(0.3)
        assert model.calls == []  # both wait for the holder
        backend.model_lock.release()
        for t in runs:
            t.join(10)
        assert sorted(name for name, _ in model.calls) == ["finished", "forward"]
    finally:
        backend.close()


def _watched_model(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path,
    table: bool,
) -> Any:
    """A model whose arrival watcher stops inside vLLM-Omni's normalisation until released."""
    from collections import OrderedDict

    from minicpm_speech_runtime.fixtures.synth import wav_bytes

    extras = _deploy(tmp_path, monkeypatch)
    plugin.register()
    model = fake_vllm_omni(extras, model_dir, {"default": wav_bytes(2.0, 24000, seed=1)},
                           tmp_path)
    if table:
        model._runtime_prompts = OrderedDict()
    model.normalising = threading.Event()
    model._build_backend()
    return model


def _arrive(model: Any, tmp_path: Path, seed: int) -> None:
    from minicpm_speech_runtime.fixtures.synth import voice_like

    spool_reference(tmp_path / "control" / "arrivals", f"req-{seed}",
                    voice_like(2.5, 16000, seed=seed), 16000)
    assert model.normalising.wait(30), "the watcher never took the arrival"


def test_an_arriving_voice_does_not_hold_up_the_models_step(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    """While the arrival watcher normalises a voice (milliseconds a voice, on vLLM-Omni's
    code), the model's forward runs: the table they share is locked per operation, not the
    model. The voice is then prepared ahead as before."""
    model = _watched_model(fake_vllm_omni, tmp_path, monkeypatch, model_dir, table=True)
    backend = model.backend
    assert isinstance(model._runtime_prompts, LockedPromptTable)
    try:
        _arrive(model, tmp_path, seed=31)
        step = threading.Thread(target=model.forward, args=(1,))
        step.start()
        step.join(5)
        assert not step.is_alive() and model.calls == [("forward", (1,))]
        assert not model.hold_arrivals.is_set()  # the voice is still being normalised
        model.hold_arrivals.set()
        assert _until(lambda: len(model._runtime_prompts) == 1)
        assert backend.prep is not None and _until(lambda: backend.prep.wait_idle(1))
        entry = next(iter(model._runtime_prompts.values()))
        was = backend.prep.counters.snapshot()
        backend.prepare_prompt(entry.cache_id, entry.path)  # its first window
        now = backend.prep.counters.snapshot()
        assert {k: now[k] - was[k] for k in now if now[k] != was[k]} == {"ahead": 1}
    finally:
        model.hold_arrivals.set()
        backend.close()


def test_a_voice_evicted_while_it_was_normalised_is_not_prepared(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    """A forward that lets a voice go while the watcher normalised it (vLLM-Omni evicts an
    unowned prompt when its table is full) wins: the watcher hands preparation nothing, so no
    job pins a voice that nobody would release."""
    from prometheus_client import REGISTRY

    model = _watched_model(fake_vllm_omni, tmp_path, monkeypatch, model_dir, table=True)
    backend = model.backend
    assert backend.prep is not None
    taken = "minicpm_speech_reference_arrivals_total"

    def arrivals_taken() -> float:
        return REGISTRY.get_sample_value(taken, {"outcome": "taken"}) or 0.0

    before = arrivals_taken(), backend.prep.pins(), backend.prep.counters.snapshot()
    try:
        _arrive(model, tmp_path, seed=32)
        with backend.model_lock:  # a forward is running
            model.hold_arrivals.set()
            assert _until(lambda: len(model._runtime_prompts) == 1)
            key = next(iter(model._runtime_prompts.keys()))
            model._runtime_prompts.pop(key)  # ... and evicts the new, unowned voice
        assert _until(lambda: arrivals_taken() == before[0] + 1)  # the watcher is past it
        assert backend.prep.wait_idle(10)
        assert backend.prep.pins() == before[1] and backend.prep.live_spool_files() == []
        assert backend.prep.counters.snapshot() == before[2]  # no job was started
    finally:
        backend.close()


def test_without_a_table_it_knows_the_watcher_takes_turns_with_the_step(
    fake_vllm_omni: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    """A vLLM-Omni whose runtime prompts are not the ``OrderedDict`` this plugin shares: the
    watcher normalises under the model lock, and the forward waits for it."""
    model = _watched_model(fake_vllm_omni, tmp_path, monkeypatch, model_dir, table=False)
    backend = model.backend
    try:
        _arrive(model, tmp_path, seed=33)
        step = threading.Thread(target=model.forward, args=(1,))
        step.start()
        step.join(0.5)
        assert step.is_alive() and model.calls == []
        model.hold_arrivals.set()
        step.join(10)
        assert model.calls == [("forward", (1,))]
    finally:
        model.hold_arrivals.set()
        backend.close()
