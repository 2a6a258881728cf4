"""A client's request error from vLLM-Omni's chat handler becomes the handler's error response."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from minicpm_speech_runtime.serving.api_errors import MARKER, patch_chat_errors


class ClientError(Exception):
    """Stands for vLLM's ``VLLMClientError``."""


class Handler:
    def __init__(self, raises: BaseException | None) -> None:
        self.raises = raises

    async def create_chat_completion(self, request: Any, raw_request: Any = None) -> Any:
        if self.raises is not None:
            raise self.raises
        return {"served": request}

    def create_error_response(self, exc: BaseException) -> dict[str, Any]:
        return {"error": str(exc), "code": 400}


@pytest.fixture
def handler_cls() -> type[Handler]:
    return type("PatchedHandler", (Handler,), {})


def test_a_client_error_is_answered_as_an_error_response(handler_cls: type[Handler]) -> None:
    assert patch_chat_errors(handler_cls, ClientError) is True
    reply = asyncio.run(handler_cls(ClientError("max_tokens=10 too large"))
                        .create_chat_completion({"x": 1}))
    assert reply == {"error": "max_tokens=10 too large", "code": 400}


def test_other_failures_and_good_requests_pass_through(handler_cls: type[Handler]) -> None:
    patch_chat_errors(handler_cls, ClientError)
    assert asyncio.run(handler_cls(None).create_chat_completion("req")) == {"served": "req"}
    with pytest.raises(RuntimeError, match="engine"):
        asyncio.run(handler_cls(RuntimeError("engine")).create_chat_completion("req"))


def test_patched_once(handler_cls: type[Handler]) -> None:
    assert patch_chat_errors(handler_cls, ClientError) is True
    wrapped = handler_cls.create_chat_completion
    assert patch_chat_errors(handler_cls, ClientError) is False
    assert handler_cls.create_chat_completion is wrapped and getattr(handler_cls, MARKER)
    assert wrapped.__name__ == "create_chat_completion"
