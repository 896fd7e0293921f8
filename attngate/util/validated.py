"""``ValidatedModel``: a frozen pydantic model that never exists unvalidated.

Construction and ``model_copy(update=...)`` both validate (pydantic's ``model_copy`` does not), and a
failure raises the subclass's own AttngateError naming every bad field, never pydantic's
ValidationError.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from attngate.errors import AttngateError, Problem, quoted


def field_problems(exc: ValidationError) -> list[tuple[str, str]]:
    """``(field, message)`` per pydantic error; field "" for a model-level check (it names its fields itself)."""
    out = []
    for e in exc.errors():
        message = e["msg"].removeprefix("Value error, ")
        if e["loc"]:
            message += f" (got {quoted(e.get('input'))})"
        out.append((".".join(map(str, e["loc"])), message))
    return out


class ValidatedModel(BaseModel):
    error: ClassVar[type[AttngateError]] = AttngateError

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            fields = field_problems(exc)
            err = self.error(
                [
                    Problem(".".join(filter(None, [type(self).__name__, f])), m, code="input.invalid-value")
                    for f, m in fields
                ]
            )
            err.fields = tuple(fields)  # for callers that locate fields their own way (a flag, an args-file key)
            raise err from None

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False):
        """A copy; with ``update``, a new validated instance (raises the class's error type)."""
        if not update:
            return super().model_copy(deep=deep)
        return type(self)(**{**{name: getattr(self, name) for name in type(self).model_fields}, **update})
