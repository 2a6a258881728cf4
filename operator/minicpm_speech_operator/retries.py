"""Which API failures are worth retrying, how soon, and how often one is reported.

A real API server answers 429, 500, 503 and times out under load; those pass, and so does an
object deleted or changed under a reconcile (404, 409). A reconcile that met one is retried
after a short delay that grows with each retry and is jittered, so that many resources
failing together do not retry together. Anything else (a 4xx the spec
caused, a bug) is not transient: Kopf's own handler backoff applies to it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0
# An error that is not transient is retried by Kopf after this long (its default is 60 s).
OTHER_ERRORS_BACKOFF_S = 10.0


class NotLeading(RuntimeError):
    """A write refused because this replica's lease is not known to be held right now."""


def is_race(error: BaseException) -> bool:
    """An object that vanished or changed under a reconcile (404, 409): the next try sees the
    new state. Not a failure worth a Warning event."""
    return isinstance(error, ApiException) and error.status in (404, 409)


def is_transient(error: BaseException) -> bool:
    if isinstance(error, ApiException):
        return error.status in TRANSIENT_STATUSES or not error.status
    return isinstance(error, NotLeading | TimeoutError | ConnectionError
                      | urllib3.exceptions.HTTPError)


def delay_s(retry: int, rng: random.Random | None = None) -> float:
    """The wait before retry number ``retry`` (0 for the first): doubling from half a second,
    capped at 30 s, and drawn between half and all of that."""
    ceiling = min(MAX_DELAY_S, math.ldexp(FIRST_DELAY_S, max(0, min(retry, 16))))
    draw = rng.random() if rng is not None else random.random()
    return ceiling * (0.5 + 0.5 * draw)


def describe(error: BaseException, limit: int = 300) -> str:
    """One line for a log or an event: the status and reason of an API error, capped."""
    if isinstance(error, ApiException):
        text = f"API {error.status} {error.reason or ''}".strip()
    else:
        text = f"{type(error).__name__}: {error}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


class FailureEvents:
    """At most one Warning event per resource and reason per ``interval_s``: a resource that
    fails at every retry does not flood its events."""

    def __init__(self, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self._last: dict[tuple[str, str, str], float] = {}

    def should_post(self, namespace: str, name: str, reason: str) -> bool:
        key, now = (namespace, name, reason), self.clock()
        if now - self._last.get(key, -self.interval_s) < self.interval_s:
            return False
        self._last[key] = now
        if len(self._last) > 10_000:  # resources come and go; forget the oldest
            for old in sorted(self._last, key=self._last.__getitem__)[:5_000]:
                del self._last[old]
        return True
