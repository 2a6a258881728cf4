"""The one error type a user's input can raise: it names the field and the fix."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

# Every message that can quote a user's input (status, events, logs) fits in this many
# characters; the API server would take far more, and one huge value must not flood them.
MESSAGE_LIMIT = 1024
_FIELD_LIMIT = 256


def capped(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    note = f"... ({len(text) - limit} more characters)"
    return text[: max(0, limit - len(note))] + note


class InvalidSpec(ValueError):
    """Bad input from outside (a manifest, a profile, a referenced object).

    ``field`` is the path as the user would write it (``spec.runtime.port``), so the
    message in the resource's status points at the line to change.
    """

    reason = "InvalidSpec"

    def __init__(self, field: str, message: str, fix: str) -> None:
        self.field = capped(field, _FIELD_LIMIT)
        # the fix always survives: it is what the user acts on
        self.fix = capped(fix, MESSAGE_LIMIT // 4)
        room = MESSAGE_LIMIT - len(self.field) - len(self.fix) - 4
        self.message = capped(message, room)
        super().__init__(f"{self.field}: {self.message}. {self.fix}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.field, self.message, self.fix))


def refuse_repeats(field: str, values: Sequence[Hashable]) -> None:
    """A list the CRD declares a set (``x-kubernetes-list-type: set``): the API server refuses
    a repeated item, and so does the operator, wherever the manifest came from."""
    seen: set[Hashable] = set()
    for i, value in enumerate(values):
        if value in seen:
            raise InvalidSpec(f"{field}[{i}]", f"{value} is listed twice", "List each once")
        seen.add(value)
