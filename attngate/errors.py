"""The project's error types. Every error carries *all* problems found, each with its location."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem: where (``file:line:col``, a flag, a config key, a rule id) and what."""

    where: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


class AttngateError(Exception):
    """Base of every error attngate raises on bad input. ``problems`` lists every problem found."""

    title = "attngate error"
    fields: tuple[tuple[str, str], ...] = ()  # (field, message) per problem, where a validated model raised it

    def __init__(self, problems: list[Problem] | Problem | str):
        if isinstance(problems, str):
            problems = [Problem(None, problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        n = len(self.problems)
        head = f"{self.title} ({n} problem{'s' if n != 1 else ''}):"
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])


class ServerArgsError(AttngateError):
    """Unknown or ill-typed server arguments (flags, args files, objects)."""

    title = "invalid server arguments"


class ModelConfigError(AttngateError):
    """A Hugging Face config.json that is malformed or describes an unsupported attention layout."""

    title = "invalid model config"


class PlatformError(AttngateError):
    """The GPU architecture is unknown or cannot be detected."""

    title = "invalid platform"


class RulesError(AttngateError):
    """A rules file that does not load or type-check; every problem has ``file:line:col``."""

    title = "invalid rules"


class InputErrors(AttngateError):
    """Several inputs were bad at once (say the server flags and the model config): every one's error, each
    under its own title. ``errors`` holds them; ``problems`` is all of theirs."""

    def __init__(self, errors: list[AttngateError]):
        self.errors = list(errors)
        super().__init__([p for err in self.errors for p in err.problems])

    def _render(self) -> str:
        return "\n".join(str(err) for err in self.errors)


def load_all(*loaders: Callable[[], Any]) -> list[Any]:
    """Run every loader, also after one failed, and return their values. The AttngateErrors of all of them are
    raised together (the one error, or InputErrors), so a user sees every bad input at once; other exceptions
    propagate."""
    values, errors = [], []
    for load in loaders:
        try:
            values.append(load())
        except AttngateError as err:
            errors.append(err)
    if errors:
        raise errors[0] if len(errors) == 1 else InputErrors(errors)
    return values
