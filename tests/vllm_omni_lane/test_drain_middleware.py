"""vLLM's own CLI and app builder take the drain middleware the pod's server command names,
and under Starlette it counts a streamed answer until its last chunk and refuses new requests
once the supervisor drains."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "vllm_omni", reason="vLLM-Omni is not installed here; `make test-vllm-omni` runs this lane"
)

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from minicpm_speech_contract.supervisor import DRAIN_MIDDLEWARE, vllm_serve_argv
from minicpm_speech_runtime.serving import control, drain
from starlette.testclient import TestClient
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.entrypoints.serve.middleware.register import init_entrypoints_middleware
from vllm.utils.argparse_utils import FlexibleArgumentParser


class Gauge:
    def __init__(self) -> None:
        self.value = 0.0

    def set(self, v: float) -> None:
        self.value = v

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1


def test_vllm_installs_the_drain_middleware_of_the_pods_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gauge = Gauge()
    monkeypatch.setattr(drain, "process_gate", lambda: drain.Gate(tmp_path, gauge))
    argv = vllm_serve_argv("model", deploy_config="deploy.yaml", port=8091,
                           served_model_name="minicpm-o")
    args, _ = make_arg_parser(FlexibleArgumentParser()).parse_known_args(argv[3:])
    assert args.middleware == [DRAIN_MIDDLEWARE]

    app = FastAPI()
    seen: list[float] = []

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(3):
            seen.append(gauge.value)
            yield f"data: {i}\n\n".encode()

    @app.post("/v1/chat/completions")
    async def chat() -> Any:
        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    init_entrypoints_middleware(args, app, ())
    client = TestClient(app)
    answer = client.post("/v1/chat/completions", json={"stream": True})
    assert answer.status_code == 200 and answer.text.count("data:") == 3
    assert seen == [1, 1, 1] and gauge.value == 0

    control.write_json(tmp_path, control.DRAIN_FILE, {"since": 0})
    refused = client.post("/v1/chat/completions", json={"stream": True})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["message"] == drain.REFUSAL
    assert client.get("/health").status_code == 200
    assert len(seen) == 3 and gauge.value == 0
