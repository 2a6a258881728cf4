"""The API server answers a request's own faults with a 4xx, and checks what it can before the
request enters the pipeline (:mod:`.request_checks`).

vLLM-Omni 0.30's chat endpoint (``api_server.create_chat_completion``) turns every exception
its handler raises into HTTP 500, so a request vLLM itself refuses with a
``VLLMValidationError`` (say ``max_tokens`` above the model's context) reaches the client as a
server fault, which clients retry and alerts count. Plain vLLM answers the same request 400:
its own handlers map ``VLLMClientError`` through ``create_error_response``. These methods of
vLLM-Omni's ``OmniOpenAIServingChat`` are wrapped:

* ``create_chat_completion``: a ``VLLMClientError`` or a :class:`.request_checks.RequestRefused`
  becomes the handler's own error response (400, 404 or 422, as vLLM maps it, with ``param``
  naming the field), which the endpoint returns as it stands. Other exceptions pass through.
* ``_attach_minicpmo45_reference_audio``, where vLLM-Omni decodes the body's ``ref_audio`` for
  stage 2: the voice rules run on the URI before it is decoded and on the samples after.
* ``_to_sampling_params_list``, where the body's ``sampling_params_list`` becomes each stage's
  parameters: unknown keys and ill-typed values are refused, naming the key.
* ``create_chat_completion`` again, inside the first: a request id the client chose
  (``request_id``, ``X-Request-Id``) that the stages cannot carry is refused.
* ``chat_completion_full_generator`` and ``chat_completion_stream_generator``: with each output
  of the request they read, the record of a voice that stage 2 refused (:mod:`.refusals`) is
  looked for; one found ends the request with a 400 naming ``ref_audio`` (an error event when
  streamed), and closing vLLM-Omni's output generator aborts the request in every stage.

Only the API server's process serves HTTP, so only it is patched (see
:func:`.plugin.register`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from .control import control_dir_from_env
from .refusals import IO_ERROR, REFUSALS_SUBDIR, Refusal, take_refusal
from .request_checks import (
    REFERENCE_FIELD,
    REQUEST_ID_FIELD,
    REQUEST_ID_HEADER,
    RequestRefused,
    check_decoded_reference,
    check_reference_source,
    check_request_id,
    check_sampling_blocks,
)

CHAT_MODULE = "vllm_omni.entrypoints.openai.serving_chat"
CHAT_CLASS = "OmniOpenAIServingChat"
PIPELINE_MODULE = "vllm_omni.model_executor.models.minicpmo_4_5.pipeline"
MARKER = "_minicpm_speech_client_errors_patched"

_lock = threading.Lock()


def patch_chat_errors(cls: type, client_error: type[BaseException],
                      as_client_error: Any = None) -> bool:
    """Answer ``client_error`` (and a :class:`RequestRefused`, made one by ``as_client_error``)
    from ``cls.create_chat_completion`` as an error response; False when already patched."""
    with _lock:
        if getattr(cls, MARKER, False):
            return False
        _wrap_chat_errors(cls, client_error, as_client_error)
        setattr(cls, MARKER, True)
        return True


def _wrap_chat_errors(cls: type, client_error: type[BaseException], as_client_error: Any) -> None:
    original = cls.create_chat_completion  # type: ignore[attr-defined]

    @functools.wraps(original)
    async def create_chat_completion(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await original(self, *args, **kwargs)
        except RequestRefused as exc:
            refused = exc if as_client_error is None else as_client_error(exc)
            return self.create_error_response(refused)
        except client_error as exc:
            return self.create_error_response(exc)

    cls.create_chat_completion = create_chat_completion  # type: ignore[attr-defined]


def patch_request_id_checks(cls: type) -> None:
    """Check the request id a client chose before ``cls.create_chat_completion`` uses it."""
    original = cls.create_chat_completion  # type: ignore[attr-defined]

    @functools.wraps(original)
    async def create_chat_completion(self: Any, request: Any, raw_request: Any = None,
                                     *args: Any, **kwargs: Any) -> Any:
        check_request_id(getattr(request, REQUEST_ID_FIELD, None), REQUEST_ID_FIELD)
        headers = getattr(raw_request, "headers", None)
        if headers is not None:
            check_request_id(headers.get(REQUEST_ID_HEADER), REQUEST_ID_HEADER)
        return await original(self, request, raw_request, *args, **kwargs)

    cls.create_chat_completion = create_chat_completion  # type: ignore[attr-defined]


def patch_reference_checks(cls: type, reference_key: str) -> None:
    """Check the voice ``cls._attach_minicpmo45_reference_audio`` decodes into the prompt's
    ``reference_key``: its URI before, its samples after."""
    original = cls._attach_minicpmo45_reference_audio  # type: ignore[attr-defined]

    @functools.wraps(original)
    async def _attach_minicpmo45_reference_audio(
        self: Any, engine_prompt: Any, request: Any, *args: Any, **kwargs: Any
    ) -> Any:
        check_reference_source(reference_source(request))
        result = await original(self, engine_prompt, request, *args, **kwargs)
        if isinstance(engine_prompt, dict):
            check_decoded_reference(engine_prompt.get(reference_key))
        return result

    cls._attach_minicpmo45_reference_audio = (  # type: ignore[attr-defined]
        _attach_minicpmo45_reference_audio)


def reference_source(request: Any) -> object:
    """The body's ``ref_audio``, looked up where vLLM-Omni 0.30 looks for it: the field, then
    ``extra_body``, then the request's undeclared fields."""
    found = getattr(request, REFERENCE_FIELD, None)
    extra_body = getattr(request, "extra_body", None)
    if found is None and isinstance(extra_body, dict):
        found = extra_body.get(REFERENCE_FIELD)
    model_extra = getattr(request, "model_extra", None)
    if found is None and isinstance(model_extra, dict):
        nested = model_extra.get("extra_body")
        if isinstance(nested, dict):
            found = nested.get(REFERENCE_FIELD)
        if found is None:
            found = model_extra.get(REFERENCE_FIELD)
    return found


def patch_sampling_checks(cls: type, params_class_of: Any) -> None:
    """Check each block ``cls._to_sampling_params_list`` is given against its stage's class;
    ``params_class_of(handler, i)`` names it."""
    original = cls._to_sampling_params_list  # type: ignore[attr-defined]

    @functools.wraps(original)
    def _to_sampling_params_list(self: Any, blocks: Any, *args: Any, **kwargs: Any) -> Any:
        check_sampling_blocks(blocks, lambda i: params_class_of(self, i))
        return original(self, blocks, *args, **kwargs)

    cls._to_sampling_params_list = _to_sampling_params_list  # type: ignore[attr-defined]


def patch_refusal_checks(cls: type, directory: Path | None,
                         error_of: Callable[[Refusal], BaseException]) -> None:
    """Read each request's outputs through :func:`checked_outputs`."""
    full = cls.chat_completion_full_generator  # type: ignore[attr-defined]
    stream = cls.chat_completion_stream_generator  # type: ignore[attr-defined]

    @functools.wraps(full)
    async def chat_completion_full_generator(
        self: Any, request: Any, outputs: Any, request_id: str, *args: Any, **kwargs: Any
    ) -> Any:
        checked = checked_outputs(outputs, request_id, directory, error_of)
        return await full(self, request, checked, request_id, *args, **kwargs)

    @functools.wraps(stream)
    def chat_completion_stream_generator(
        self: Any, request: Any, outputs: Any, request_id: str, *args: Any, **kwargs: Any
    ) -> Any:
        checked = checked_outputs(outputs, request_id, directory, error_of)
        return stream(self, request, checked, request_id, *args, **kwargs)

    cls.chat_completion_full_generator = (  # type: ignore[attr-defined]
        chat_completion_full_generator)
    cls.chat_completion_stream_generator = (  # type: ignore[attr-defined]
        chat_completion_stream_generator)


async def checked_outputs(
    outputs: AsyncIterator[Any], request_id: str, directory: Path | None,
    error_of: Callable[[Refusal], BaseException],
) -> AsyncIterator[Any]:
    """``outputs`` as they come, until stage 2's refusal of ``request_id`` is found: then
    ``error_of(refusal)`` is raised and ``outputs`` closed, which aborts the request."""
    try:
        async for output in outputs:
            refusal = take_refusal(directory, request_id)
            if refusal is not None:
                raise error_of(refusal)
            yield output
        refusal = take_refusal(directory, request_id)
        if refusal is not None:
            raise error_of(refusal)
    finally:
        close = getattr(outputs, "aclose", None)
        if close is not None:
            await close()


def patch_api_server() -> bool:
    """Patch vLLM-Omni's chat handler class, imported here (the API server imports it anyway);
    False when already patched."""
    import importlib

    from vllm.exceptions import VLLMClientError, VLLMServerError, VLLMValidationError

    module = importlib.import_module(CHAT_MODULE)
    cls = getattr(module, CHAT_CLASS)

    def as_client_error(exc: RequestRefused) -> Any:
        # vLLM's message ends "(parameter=<field>)" and its error's ``param`` names the field
        return VLLMValidationError(exc.detail, parameter=exc.parameter)

    def error_of(refusal: Refusal) -> BaseException:
        error: BaseException
        if refusal.reason == IO_ERROR:
            error = VLLMServerError(refusal.message)
        else:
            error = VLLMValidationError(refusal.message, parameter=REFERENCE_FIELD)
        return error

    def params_class_of(handler: Any, index: int) -> type | None:
        stages = list(getattr(handler.engine_client, "stage_configs", []) or [])
        if index >= len(stages):
            return None  # vLLM-Omni answers a block beyond the pipeline with its own 400
        diffusion = module.get_stage_type(stages[index]) == "diffusion"
        cls: type = module.OmniDiffusionSamplingParams if diffusion else module.SamplingParams
        return cls

    pipeline = importlib.import_module(PIPELINE_MODULE)
    with _lock:
        if getattr(cls, MARKER, False):
            return False
        patch_reference_checks(cls, pipeline.MINICPMO45_REFERENCE_AUDIO_KEY)
        patch_sampling_checks(cls, params_class_of)
        patch_request_id_checks(cls)
        control = control_dir_from_env()
        patch_refusal_checks(cls, None if control is None else control / REFUSALS_SUBDIR,
                             error_of)
        _wrap_chat_errors(cls, VLLMClientError, as_client_error)
        setattr(cls, MARKER, True)
        return True
