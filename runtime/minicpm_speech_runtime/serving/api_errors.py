"""A request error that vLLM classifies as the client's is answered with its 4xx.

vLLM-Omni 0.30's chat endpoint (``api_server.create_chat_completion``) turns every exception
its handler raises into HTTP 500, so a request vLLM itself refuses with a
``VLLMValidationError`` (say ``max_tokens`` above the model's context) reaches the client as a
server fault, which clients retry and alerts count. Plain vLLM answers the same request 400:
its own handlers map ``VLLMClientError`` through ``create_error_response``. This wraps the
handler's ``create_chat_completion`` so that such an error becomes the handler's own error
response (400, 404 or 422, as vLLM maps it), which the endpoint returns as it stands. Other
exceptions pass through untouched.

Only the API server's process serves HTTP, so only it is patched (see
:func:`.plugin.register`).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

CHAT_MODULE = "vllm_omni.entrypoints.openai.serving_chat"
CHAT_CLASS = "OmniOpenAIServingChat"
MARKER = "_minicpm_speech_client_errors_patched"

_lock = threading.Lock()


def patch_chat_errors(cls: type, client_error: type[BaseException]) -> bool:
    """Answer ``client_error`` from ``cls.create_chat_completion`` as an error response;
    False when already patched."""
    with _lock:
        if getattr(cls, MARKER, False):
            return False
        original = cls.create_chat_completion  # type: ignore[attr-defined]

        @functools.wraps(original)
        async def create_chat_completion(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await original(self, *args, **kwargs)
            except client_error as exc:
                return self.create_error_response(exc)

        cls.create_chat_completion = create_chat_completion  # type: ignore[attr-defined]
        setattr(cls, MARKER, True)
        return True


def patch_api_server() -> bool:
    """Patch vLLM-Omni's chat handler class, imported here (the API server imports it anyway)."""
    import importlib

    from vllm.exceptions import VLLMClientError

    module = importlib.import_module(CHAT_MODULE)
    return patch_chat_errors(getattr(module, CHAT_CLASS), VLLMClientError)
