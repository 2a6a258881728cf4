"""An in-memory Kubernetes API server for the tests and the operator's ``demo`` command.

It lives beside the operator, not inside it, so the operator image does not ship it (nor
kmock, which it is built on): install it with ``pip install 'minicpm-speech[demo]'``. The
emulator itself, what it adds to kmock and its known gaps are described in
:mod:`minicpm_speech_emulator.emulator`.
"""

from __future__ import annotations

from .emulator import (
    ApiRequest,
    BackgroundEmulator,
    ClusterEmulator,
    Fault,
    RunningEmulator,
    load_crd,
    running_emulator,
    write_kubeconfig,
)

__all__ = [
    "ApiRequest",
    "BackgroundEmulator",
    "ClusterEmulator",
    "Fault",
    "RunningEmulator",
    "load_crd",
    "running_emulator",
    "write_kubeconfig",
]
