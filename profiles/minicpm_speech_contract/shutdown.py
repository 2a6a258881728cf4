"""How long a serving pod may take to leave service, each number owned here once.

A pod that is deleted (a scale-down, a rollout, a drained node) goes through, in order:

1. the preStop hook, :data:`PRESTOP_SECONDS`: the pod still serves while its endpoint's
   removal reaches every kube-proxy and ingress; a request routed to it meanwhile is served,
   not refused;
2. SIGTERM to the supervisor, which drains: ``/readyz`` answers 503, new streams are refused
   with 503 and ``Retry-After``, and the streams in flight finish, for at most the drain bound
   (``--drain-seconds``, :func:`drain_seconds`);
3. SIGTERM to the server, which has ``--grace-seconds`` (:data:`SERVER_GRACE_SECONDS`) to
   stop before it is killed;
4. the MPS control daemon's ``quit``: after its answer, :data:`MPS_QUIT_SECONDS` at most for
   the daemon to be gone before it is killed.

The pod's ``terminationGracePeriodSeconds`` (:func:`termination_grace_seconds`) is their sum
and :data:`MARGIN_SECONDS`, so the kubelet's SIGKILL never comes while a step still runs.

The drain bound covers the longest stream the pod serves. What bounds a stream's length is the
Talker (stage 1): it holds at most ``max_model_len`` tokens, and its speech codes come at
25 Hz. Its context is 4096 tokens (vLLM-Omni 0.30's ``minicpmo_4_5.yaml``); a profile may lower
it, never raise it (the profile schema's cap), so an answer carries at most 4096 / 25, about
164 s, of audio. The operator derives each pod's bound from its profile's value. A draining
pod takes no new stream, so its load only falls; the bound still lets that audio be produced at
half real time.
"""

from __future__ import annotations

import math

PRESTOP_SECONDS = 5
SERVER_GRACE_SECONDS = 25.0
MPS_QUIT_SECONDS = 20.0
# The MPS quit command's own answer (10 s at most), the kubelet's work between the steps,
# and the processes' exit.
MARGIN_SECONDS = 15.0

TALKER_MAX_MODEL_LEN = 4096
SPEECH_TOKENS_PER_SECOND = 25
SLOWEST_DRAIN_REAL_TIME_MARGIN = 0.5


def longest_stream_audio_seconds(talker_max_model_len: int = TALKER_MAX_MODEL_LEN) -> float:
    """The most audio one answer can carry: every Talker token a speech code."""
    return talker_max_model_len / SPEECH_TOKENS_PER_SECOND


def drain_seconds(talker_max_model_len: int = TALKER_MAX_MODEL_LEN) -> float:
    """How long a draining pod waits for its streams: the longest answer's audio at the
    slowest real-time margin allowed, in whole seconds."""
    audio = longest_stream_audio_seconds(talker_max_model_len)
    return float(math.ceil(audio / SLOWEST_DRAIN_REAL_TIME_MARGIN))


DRAIN_SECONDS = drain_seconds()


def termination_grace_seconds(drain: float = DRAIN_SECONDS,
                              grace: float = SERVER_GRACE_SECONDS) -> int:
    """The pod's ``terminationGracePeriodSeconds`` for a drain bound and a server grace."""
    return math.ceil(PRESTOP_SECONDS + drain + grace + MPS_QUIT_SECONDS + MARGIN_SECONDS)
