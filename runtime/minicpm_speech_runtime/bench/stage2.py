"""Stage 2 of vLLM-Omni's MiniCPM-o 4.5 pipeline, driven the way a serving step drives it.

What is vLLM-Omni's own code here: the Code2Wav model (``MiniCPMO45Code2Wav``, built by its own
``load_weights``), Stage 1's connector hook that cuts the Talker's codec tokens into windows
(``tts2code2wav_async_chunk``), the payload's wire form (``to_dict``) and the receiving side's
commit of a chunk into the Stage-2 request (``OmniChunkTransferAdapter._commit_received_chunk``),
and the reading of a serving prompt's reference voice that the plugin spools at arrival.
What stands in for parts that need vLLM's engine and a GPU platform: the model's
``vllm_config`` (the four attributes the model reads), the shared-memory transport (a payload
is handed over in process), and the generation runner's step: the tokens of every request with
a fresh chunk flattened into ``input_ids``, its ``seq_token_counts`` and ``request_ids``, each
request's intermediate buffer as ``runtime_additional_information``, and
``on_requests_finished`` after a request's last chunk.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import vllm_omni.model_executor.models.cosyvoice3.code2wav_core.hifigan as omni_hifigan
from vllm_omni.data_entry_keys import MetaStruct, OmniPayloadStruct, to_dict
from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
    OmniChunkTransferAdapter,
)
from vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni.model_executor.models.minicpmo_4_5.pipeline import MINICPMO45_REFERENCE_AUDIO_KEY
from vllm_omni.model_executor.stage_input_processors.minicpmo_4_5_omni import (
    tts2code2wav_async_chunk,
)

from ..serving.plugin import spool_arrival
from .parity import _FixedNoiseTorch, fixed_nsf_noise

SILENCE = 4218  # the codes vLLM-Omni's connector puts before a stream's first window
CONNECTOR = {"codec_chunk_frames": 25, "codec_left_context_frames": 3}


def build_code2wav(
    model_dir: Path, extras: Mapping[str, Any], max_num_seqs: int = 8
) -> MiniCPMO45Code2Wav:
    """vLLM-Omni's Code2Wav model on ``model_dir``, loaded as vLLM's loader loads it, for a
    stage scheduled with ``max_num_seqs``."""
    config = SimpleNamespace(
        model_config=SimpleNamespace(
            model=str(model_dir),
            revision=None,
            stage_connector_config={"name": "SharedMemoryConnector", "extra": dict(extras)},
        ),
        load_config=SimpleNamespace(load_format="auto"),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
    )
    model = MiniCPMO45Code2Wav(vllm_config=config)
    model.load_weights(iter(()))
    return model


def cfm_noise(model: MiniCPMO45Code2Wav) -> torch.Tensor:
    """The CFM's fixed noise that decodes of ``model`` read: vLLM-Omni's, or the engine's."""
    backend: Any = model.backend
    engine = getattr(backend, "engine", None)
    if engine is not None:  # this project's Code2WavBackend -> Code2WavEngine
        return engine.runner.flow.decoder.rand_noise  # type: ignore[no-any-return]
    return backend.flow.decoder.rand_noise  # type: ignore[no-any-return]


@contextlib.contextmanager
def fixed_vocoder_noise() -> Iterator[None]:
    """HiFT's NSF source draws zeros instead of random phases and noise, in both vocoders."""
    saved = omni_hifigan.torch
    omni_hifigan.torch = _FixedNoiseTorch()
    try:
        with fixed_nsf_noise():
            yield
    finally:
        omni_hifigan.torch = saved


@dataclass(frozen=True)
class Request:
    """One utterance: its codec tokens, its reference voice (None: the model's default)."""

    rid: str
    tokens: list[int]
    ref: np.ndarray | None = None
    ref_rate: int | None = None
    start: int = 0  # the Talker tick of its first token


class Stage2:
    """Stage 1's connector hook, the in-process transport, and Stage 2's steps around a model."""

    def __init__(
        self, model: MiniCPMO45Code2Wav, extras: Mapping[str, Any], device: str = "cpu"
    ) -> None:
        self.model = model
        self.device = torch.device(device)  # where the runner puts a step's input_ids
        self.sender = SimpleNamespace(
            connector=SimpleNamespace(config={"extra": dict(extras)}), request_payload={}
        )
        adapter = OmniChunkTransferAdapter
        self.receiver = SimpleNamespace(
            get_req_chunk=defaultdict(int),
            model_mode="generation",
            upstream_exhausted_requests=set(),
            segment_finished_requests=set(),
            _finished_load_reqs=set(),
            _is_truthy_scalar=adapter._is_truthy_scalar,
            _refresh_generation_chunk_prefill_state=adapter._refresh_generation_chunk_prefill_state,
        )
        self.talker: dict[str, Any] = {}
        self.consumer: dict[str, Any] = {}
        self.pcm: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.windows: dict[str, list[int]] = defaultdict(list)  # tokens of each step's window
        self.forwards: list[tuple[list[str], int | None]] = []  # requests, engine steps
        self.aborts: dict[str, int] = {}  # request -> the Talker tick it is aborted at

    def add(self, request: Request) -> None:
        """The request arrives: its stage-1 and stage-2 records, and, where stage 2 takes voices
        at arrival, its reference spooled as vLLM-Omni's orchestrator hands it over."""
        if request.ref is not None and getattr(self.model.backend, "arrival_watcher", None):
            spool_arrival(request.rid, {
                MINICPMO45_REFERENCE_AUDIO_KEY: (request.ref, request.ref_rate)})
        info: dict[str, Any] = {}
        if request.ref is not None:
            info = {
                "codes": {"ref": torch.as_tensor(request.ref, dtype=torch.float32)},
                "meta": {"ref_audio_sr": request.ref_rate},
            }
        self.talker[request.rid] = SimpleNamespace(
            external_req_id=request.rid,
            request_id=request.rid,
            status=SimpleNamespace(name="RUNNING"),
            additional_information=info,
            is_finished=lambda: False,
        )
        self.consumer[request.rid] = SimpleNamespace(
            request_id=request.rid,
            external_req_id=request.rid,
            prompt_token_ids=[],
            additional_information=None,
            model_intermediate_buffer=None,
            num_computed_tokens=0,
            resumable=True,
            prefill_stats=None,
        )

    def emit(self, rid: str, tokens: Sequence[int], finished: bool = False) -> bool:
        """Stage 1 produced ``tokens`` for ``rid``; True when a chunk reached Stage 2."""
        codes = {"codes": {"audio": torch.tensor(list(tokens), dtype=torch.long)}}
        payload = tts2code2wav_async_chunk(self.sender, codes, self.talker[rid], finished)
        if payload is None:
            if not finished:
                return False
            payload = OmniPayloadStruct()
        # What the sending adapter stamps on every payload before the connector's put.
        if payload.meta is None:
            payload.meta = MetaStruct()
        payload.meta.finished = torch.tensor(finished, dtype=torch.bool)
        if payload.meta.is_segment_finished is None:
            payload.meta.is_segment_finished = torch.tensor(False, dtype=torch.bool)
        chunk = self.receiver.get_req_chunk[rid]
        return bool(
            OmniChunkTransferAdapter._commit_received_chunk(
                self.receiver,
                self.consumer[rid],
                (to_dict(payload), 0),
                stage_id=2,
                req_id=rid,
                chunk_id=chunk,
                connector_get_key=f"{rid}_1_{chunk}",
            )
        )

    def step(self, rids: Sequence[str]) -> None:
        """One Stage-2 forward over the requests that have a fresh chunk."""
        scheduled = [self.consumer[r] for r in rids]
        ids = [torch.tensor(r.prompt_token_ids, dtype=torch.long) for r in scheduled]
        infos = []
        for r in scheduled:
            info = dict(r.model_intermediate_buffer or r.additional_information or {})
            info["generated_len"] = 0
            infos.append(info)
        engine = getattr(self.model.backend, "engine", None)
        before = engine.counters.steps if engine is not None else None
        out = self.model.forward(
            input_ids=torch.cat(ids).to(self.device),
            positions=None,
            runtime_additional_information=infos,
            seq_token_counts=[len(i) for i in ids],
            request_ids=list(rids),
        )
        steps = None if engine is None or before is None else engine.counters.steps - before
        self.forwards.append((list(rids), steps))
        for rid, tokens, audio in zip(rids, ids, out.multimodal_outputs["model_outputs"],
                                      strict=True):
            self.windows[rid].append(len(tokens))
            self.pcm[rid].append(audio.detach().clone())
        done = {r for r in rids if r in self.receiver.upstream_exhausted_requests}
        if done:
            self.model.on_requests_finished(done)

    def run(
        self,
        requests: Sequence[Request],
        burst: Sequence[int] = (1,),
        finish_with_last: bool = False,
        tick_s: float = 0.0,
    ) -> dict[str, np.ndarray]:
        """Every request's whole utterance, interleaved; returns each request's PCM.

        Every request arrives at tick 0 (see :meth:`add`); a Talker tick lasts at least
        ``tick_s`` seconds (0: as fast as the loop runs).

        Each Talker tick hands over ``burst[i % len(burst)]`` tokens per request (the Talker
        emits one per decode step). A request's finish comes on the tick after its last token,
        as the Talker's end token (no codec token) brings it, or with ``finish_with_last`` on
        the same hand-over as its last tokens. A request in ``aborts`` is let go at that tick
        (``on_requests_finished``, as for a client that went away) and returns no PCM.
        """
        for request in requests:
            self.add(request)
        sent = {r.rid: 0 for r in requests}
        finished: set[str] = set()
        tick = 0
        next_tick = time.monotonic()
        while len(finished) < len(requests):
            next_tick += tick_s
            ready = []
            for request in requests:
                if request.rid in finished or tick < request.start:
                    continue
                if self.aborts.get(request.rid) == tick:  # the client went away
                    finished.add(request.rid)
                    self.model.on_requests_finished({request.rid})
                    continue
                n = burst[tick % len(burst)]
                start = sent[request.rid]
                delta = request.tokens[start : start + n]
                sent[request.rid] = start + len(delta)
                last = not delta or (finish_with_last and sent[request.rid] == len(request.tokens))
                if last:
                    finished.add(request.rid)
                if self.emit(request.rid, delta, last):
                    ready.append(request.rid)
            if ready:
                self.step(ready)
            tick += 1
            time.sleep(max(0.0, next_tick - time.monotonic()))
        return {r.rid: torch.cat(self.pcm[r.rid]).numpy() for r in requests
                if r.rid not in self.aborts}
