"""How far ahead of its listener each Code2Wav stream is: the pod's real-time margin.

A listener starts playing a stream at its first audio and then consumes one audio second per
wall second. A stream's margin is the audio it has produced per wall second since then; below
1 the listener has caught up with it and hears a gap. The pod reports its worst stream's
margin, and its reciprocal, the real-time factor (wall seconds per audio second): that one rises
with load and is 0 when no stream plays, which is what an autoscaler's target needs
(minicpm_speech_contract.pod_metrics). Each stream's time to first audio, from its first codes
reaching Code2Wav, is observed once.

Pure bookkeeping over a clock: :class:`~.backend.Code2WavBackend` tells it what each engine
step produced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..voice.dsp import PROMPT_RATE

# The vocoder speaks at the rate its reference prompts are read at.
AUDIO_RATE = PROMPT_RATE


@dataclass(slots=True)
class _Stream:
    opened: float
    first_audio: float | None = None
    audio_seconds: float = 0.0


class RealTimeTracker:
    def __init__(self) -> None:
        self._streams: dict[int, _Stream] = {}

    def opened(self, stream_id: int, now: float) -> None:
        self._streams[stream_id] = _Stream(now)

    def produced(self, stream_id: int, samples: int, now: float) -> float | None:
        """Audio of one step; the stream's time to first audio when this was its first."""
        stream = self._streams.get(stream_id)
        if stream is None or samples <= 0:
            return None
        stream.audio_seconds += samples / AUDIO_RATE
        if stream.first_audio is not None:
            return None
        stream.first_audio = now
        return now - stream.opened

    def ended(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)

    def worst_margin(self, now: float) -> float:
        """The lowest margin of the streams playing; +inf when none plays."""
        margins = [s.audio_seconds / (now - s.first_audio) for s in self._streams.values()
                   if s.first_audio is not None and now > s.first_audio]
        return min(margins, default=math.inf)


def real_time_factor(margin: float) -> float:
    """Wall seconds per audio second of a stream with ``margin``: 0 when none plays."""
    return 0.0 if math.isinf(margin) else math.inf if margin <= 0 else 1.0 / margin
