"""The one error type a user's input can raise: it names the field and the fix."""

from __future__ import annotations


class InvalidSpec(ValueError):
    """Bad input from outside (a manifest, a profile, a referenced object).

    ``field`` is the path as the user would write it (``spec.runtime.port``), so the
    message in the resource's status points at the line to change.
    """

    reason = "InvalidSpec"

    def __init__(self, field: str, message: str, fix: str) -> None:
        self.field = field
        self.message = message
        self.fix = fix
        super().__init__(f"{field}: {message}. {fix}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.field, self.message, self.fix))
