"""A Thinker reply with nothing to speak ends its request without audio, not the Talker stage.

vLLM-Omni 0.30's Thinker-to-Talker bridge hands the Talker the Thinker's hidden states from the
reply's first position on, and a reply of one token has none there (its one token has no hidden
state yet). The bridge then hands over no condition at all, and the Talker's ``preprocess``
raises, which ends stage 1's engine process and every stream on the pod: one request with
``"max_tokens": 1`` (or a stop string met at the first token) is enough. The Talker already
finishes a request whose condition is *empty* ("the thinker chose not to speak"), with no audio
codes; this turns a *missing* condition into an empty one, so that request ends the same way.

The seam is the Talker module's own name for reading the handoff (``get_tts_handoff``), wrapped
in that module's namespace only; duplex sessions, whose handoff follows other rules, are left
to vLLM-Omni.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

TALKER_MODULE = "vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_omni_tts"
HANDOFF = "get_tts_handoff"
MARKER = "_minicpm_speech_missing_handoff_patched"

_lock = threading.Lock()


def empty_when_missing(
    read: Callable[[dict[str, object]], tuple[object | None, object | None]],
    empty: Callable[[], tuple[object, object]],
) -> Callable[[dict[str, object]], tuple[object | None, object | None]]:
    """``read``, but ``empty()`` where it finds no handoff at all outside a duplex session."""

    @functools.wraps(read)
    def get_tts_handoff(info: dict[str, object]) -> tuple[object | None, object | None]:
        token_ids, hidden_states = read(info)
        if token_ids is None and hidden_states is None and isinstance(info, Mapping) and not (
                info.get("native_duplex")):
            log.warning("Talker: request %s has no Thinker condition (a reply too short to "
                        "speak); it ends without audio", str(info.get("request_id", "?"))[:100])
            return empty()
        return token_ids, hidden_states

    return get_tts_handoff


def patch_talker(module: Any) -> bool:
    """Wrap the Talker module's handoff reader; False when already wrapped."""
    import torch

    def empty() -> tuple[object, object]:
        return torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.float32)

    with _lock:
        if getattr(module, MARKER, False):
            return False
        setattr(module, HANDOFF, empty_when_missing(getattr(module, HANDOFF), empty))
        setattr(module, MARKER, True)
        return True
