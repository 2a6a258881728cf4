"""The serving pod's metrics a scaler reads, named once: the runtime exports them on the health
port's ``/metrics`` and the operator's HorizontalPodAutoscaler asks the Prometheus Adapter for
them by these names, so a rename on one side cannot silently leave the scaler blind.

Each is per pod (a Prometheus Adapter ``Pods`` metric is one value per pod, averaged by the
HPA over the Deployment's pods):

* :data:`ACTIVE_STREAMS`: Code2Wav streams in the engine, decoding.
* :data:`QUEUED_STREAMS`: streams waiting for an engine slot (stage 2's ``max_num_seqs`` full).
* :data:`REAL_TIME_MARGIN`: the worst active stream's audio seconds produced per wall second
  since its first audio; below 1 a listener playing it hears gaps. +Inf with no active stream.
* :data:`REAL_TIME_FACTOR`: the same stream's wall seconds per audio second, 1 / margin, and 0
  with no active stream. A scaler adds pods when a metric rises above its target; the margin
  falls as load rises, so the HPA reads this one, with the target 1 / the margin wanted.
* :data:`FIRST_AUDIO_SECONDS`: a histogram of a stream's first codes reaching Code2Wav to its
  first audio.
"""

from __future__ import annotations

PREFIX = "minicpm_speech"
ACTIVE_STREAMS = f"{PREFIX}_code2wav_active_streams"
QUEUED_STREAMS = f"{PREFIX}_code2wav_waiting_streams"
REAL_TIME_MARGIN = f"{PREFIX}_code2wav_real_time_margin"
REAL_TIME_FACTOR = f"{PREFIX}_code2wav_real_time_factor"
FIRST_AUDIO_SECONDS = f"{PREFIX}_code2wav_first_audio_seconds"
