"""What the API server checks of a speech request before it enters the pipeline.

A request's content reaches stage 2 only after the Thinker and the Talker have worked on it,
and there vLLM-Omni 0.30 has no way to fail one request: an exception in stage 2's ``forward``
ends the engine process, every stream on the pod with it. So what the content decides is
decided here, in the API server's process, and refused with a 400 that names the field:

* the reference voice (``ref_audio``): a WAV carried in a ``data:`` URI is decoded by the same
  :func:`~minicpm_speech_runtime.voice.wav.decode_wav` that stage 2's preparation uses (size,
  header, channels, rate, length, non-finite and silent samples); audio of any other container
  or scheme is held to the same rules once vLLM's media loader has decoded it
  (:func:`check_decoded_reference`);
* the per-stage sampling blocks (``sampling_params_list``): every key must be a field of the
  stage's parameters class, and a value the class cannot take is named by its key
  (:func:`check_sampling_blocks`), where vLLM-Omni would answer a bare ``TypeError`` with 500;
* a request id the client chose (``request_id``, ``X-Request-Id``): one the stages' hand-over
  cannot carry would leave its request waiting forever (:func:`check_request_id`).

Nothing here imports vLLM: :mod:`.api_errors` turns a :class:`RequestRefused` into vLLM's own
error response.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..voice.wav import (
    MAX_BYTES,
    MAX_SECONDS,
    MIN_SECONDS,
    BadReference,
    decode_wav,
    validate_samples,
)

REFERENCE_FIELD = "ref_audio"
SAMPLING_FIELD = "sampling_params_list"
REQUEST_ID_FIELD = "request_id"
REQUEST_ID_HEADER = "X-Request-Id"
# vLLM-Omni names each request's shared-memory hand-over between stages after its id: one with
# a "/" or longer than about 250 characters never reaches stage 2, and its client waits forever.
MAX_REQUEST_ID = 128
_REQUEST_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:-]{{0,{MAX_REQUEST_ID - 1}}}")
# base64 of MAX_BYTES, and room for the longest media type a data URI carries
MAX_REFERENCE_URI_CHARS = 4 * ((MAX_BYTES + 2) // 3) + 256
_DATA_URI = re.compile(r"data:(?P<type>[^,;]{0,127})(?P<params>(;[^,;]{0,127}){0,8}),", re.ASCII)


class RequestRefused(Exception):
    """Request content the server will not run; ``parameter`` names the field in the body.

    Not a ``ValueError``: vLLM-Omni's handler turns those into a bare message on some paths,
    dropping the field; this one reaches the handler's wrapper (:mod:`.api_errors`), which
    answers it as vLLM's own validation error, ``param`` included."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter, self.detail = parameter, message


def check_request_id(value: object, field: str) -> None:
    """Refuse a client's request id (body field or header) the pipeline cannot carry."""
    if value is None:
        return
    if not isinstance(value, str) or not _REQUEST_ID.fullmatch(value):
        raise RequestRefused(
            field, f"{str(value)[:40]!r} is not a request id this server can carry: use 1 to "
            f"{MAX_REQUEST_ID} letters, digits, '.', '_', ':' or '-', starting with a letter "
            "or digit")


def refused_reference(exc: BadReference) -> RequestRefused:
    return RequestRefused(
        REFERENCE_FIELD,
        f"{exc}; send a mono WAV of {MIN_SECONDS:g} to {MAX_SECONDS:g} s of speech",
    )


def check_reference_source(source: object) -> None:
    """Refuse a reference URI that is too long, or a WAV in a ``data:`` URI that breaks the
    voice rules; other URIs are left to vLLM's media loader and :func:`check_decoded_reference`."""
    if not isinstance(source, str):
        return  # vLLM-Omni refuses a non-string itself, naming the field
    if len(source) > MAX_REFERENCE_URI_CHARS:
        raise RequestRefused(
            REFERENCE_FIELD,
            f"{len(source)} characters; a reference voice URI holds at most "
            f"{MAX_REFERENCE_URI_CHARS} (a {MAX_BYTES // 2**20} MiB file)",
        )
    payload = wav_payload(source)
    if payload is None:
        return
    try:
        decode_wav(payload)
    except BadReference as exc:
        raise refused_reference(exc) from None


def wav_payload(source: str) -> bytes | None:
    """The bytes of a base64 ``data:`` URI whose payload is a RIFF/WAVE file; None for any
    other URI (vLLM's loader answers a malformed one itself)."""
    match = _DATA_URI.match(source)
    if match is None or ";base64" not in match.group("params").lower():
        return None
    encoded = source[match.end():]
    try:
        head = base64.b64decode(encoded[:16] + "=" * (-len(encoded[:16]) % 4))
    except (binascii.Error, ValueError):
        return None
    if not head.startswith(b"RIFF"):
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None


def check_decoded_reference(reference: object) -> None:
    """The voice rules for ``(samples, sample_rate)`` as vLLM's media loader decoded them."""
    if not isinstance(reference, tuple) or len(reference) != 2:
        return
    samples, rate = reference
    try:
        rate_hz = float(rate)
        if not rate_hz.is_integer():
            raise BadReference("sample-rate", f"{rate_hz} Hz is not a whole number of hertz")
        validate_samples(np.asarray(samples), int(rate_hz))
    except BadReference as exc:
        raise refused_reference(exc) from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise RequestRefused(REFERENCE_FIELD, f"not decodable as audio ({exc})") from None


def check_sampling_blocks(blocks: object, params_class_of: Callable[[int], type | None]) -> None:
    """Refuse a sampling block with a key that stage's parameters class lacks, a value of the
    wrong type for its field, or an integer no 64-bit field holds; ``params_class_of(i)`` is
    the class stage ``i``'s block becomes (None: not known, not checked). vLLM-Omni calls this
    only for a body that has the field, so ``null`` is a client's too. Rules across values
    (``min_tokens`` above ``max_tokens``, say) are left to the class, which vLLM answers 400."""
    if not isinstance(blocks, Sequence) or isinstance(blocks, (str, bytes)):
        raise RequestRefused(SAMPLING_FIELD, "must be a list of objects, one per stage "
                             "(Thinker, Talker, Code2Wav)")
    for index, block in enumerate(blocks):
        cls = params_class_of(index)
        where = f"{SAMPLING_FIELD}[{index}]"
        if cls is None:
            continue  # a block beyond the pipeline: vLLM-Omni answers it, naming the count
        if not isinstance(block, Mapping):
            raise RequestRefused(where, f"must be an object of sampling parameters, not "
                                 f"{type(block).__name__}")
        unknown = sorted(str(k) for k in block if k not in field_names(cls))
        if unknown:
            raise RequestRefused(
                f"{where}.{unknown[0][:80]}",
                f"unknown sampling parameter{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(k[:80]) for k in unknown[:8])} for stage {index}; "
                "remove it or check its spelling",
            )
        for key, value in block.items():
            if isinstance(value, int) and not isinstance(value, bool) and not (
                    INT64_MIN <= value <= INT64_MAX):
                raise RequestRefused(f"{where}.{key}",
                                     f"{value} does not fit a signed 64-bit integer")
        mistyped = type_error(cls, block)
        if mistyped is not None:
            key, message = mistyped
            raise RequestRefused(f"{where}.{key}", f"a value of the wrong type: {message}")


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_MSGSPEC_PATH = re.compile(r"at `\$\.(?P<key>[A-Za-z0-9_]{1,80})")


def field_names(cls: type) -> frozenset[str]:
    struct_fields = getattr(cls, "__struct_fields__", None)
    if struct_fields is not None:
        return frozenset(struct_fields)
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls))
    return frozenset(getattr(cls, "__annotations__", {}))


def type_error(cls: type, block: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(key, message)`` for a value that ``cls`` does not take by its annotations; None when
    every value has its field's type. vLLM's ``SamplingParams`` is a msgspec struct, whose own
    conversion checks each value against its field's type and names the field."""
    if getattr(cls, "__struct_fields__", None) is None:
        try:
            cls(**block)
        except (TypeError, OverflowError) as exc:
            return culprit(cls, block), str(exc)[:200]
        except Exception:  # a rule across values: the class answers it itself
            return None
        return None
    import msgspec

    try:
        msgspec.convert(dict(block), cls)
    except msgspec.ValidationError as exc:
        found = _MSGSPEC_PATH.search(str(exc))
        if found is not None:
            return found.group("key"), str(exc)[:200]
        return None  # a rule across values, raised by the class's own checks
    except Exception:
        return None
    return None


def culprit(cls: type, block: Mapping[str, Any]) -> str:
    """The first key whose value alone ``cls`` cannot take; ``*`` if no one value is."""
    for key, value in block.items():
        try:
            cls(**{key: value})
        except (TypeError, OverflowError):
            return str(key)[:80]
        except Exception:
            continue
    return "*"
