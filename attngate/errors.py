"""Every error type attngate raises. Each carries *all* problems found, each with its location, a stable code of its
kind (for tools that match on errors: ``<area>.<kind>``, e.g. ``server-args.unknown-flag``, given where the problem
is constructed; the error type's ``code`` for a problem that names none) and an optional help line (what to do about
it: a did-you-mean goes there, not into the message)."""

from __future__ import annotations

import dataclasses
import operator
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

#: problems an error lists in full; the rest are counted (``and N more problems``)
MAX_PROBLEMS = 100
#: characters of the input a problem quotes: its ``where`` (a flag, a key, a path) and each word of its message
MAX_QUOTED = 200
#: characters of a message or a help line (the longest rule message is a few hundred)
MAX_MESSAGE = 1000

#: what a terminal would act on or hide: C0/C1 controls (ESC, BEL, CR...), format characters (bidi overrides and
#: isolates, zero-width ones, soft hyphen), lone surrogates, line and paragraph separators
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_SUSPECT = re.compile(r"[^\x20-\x7e\n]")  # all but printable ASCII and the newline: checked one by one
_LONG_WORD = re.compile(r"\S{%d,}" % (MAX_QUOTED + 1))
_MORE = re.compile(r"and (\d+) more problems?")


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if unicodedata.category(ch) not in _HIDDEN:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` safe to show on a terminal: every control, format or bidi character (ESC, BEL, CR, U+202E, U+200B,
    a lone surrogate...) written as its escape (``\\x1b``, ``\\u202e``), newlines kept; printable text unchanged.
    Every text renderer of attngate sends what came from an input through it (JSON output escapes on its own)."""
    if text.isascii() and text.isprintable():
        return text
    return _SUSPECT.sub(_escape, text)


def clip(text: str, limit: int = MAX_QUOTED) -> str:
    """``text`` in at most ``limit`` characters of its own: the middle of a longer one left out and counted, so that
    both ends (a file name and its ``:line:col``, a message and its did-you-mean) stay."""
    if len(text) <= limit:
        return text
    tail = limit // 3
    return f"{text[: limit - tail]}...({len(text) - limit} characters)...{text[len(text) - tail :]}"


def quoted(value: Any, limit: int = MAX_QUOTED) -> str:
    """``repr(value)`` as a message quotes it: clipped (:func:`clip`); an integer past Python's limit on decimal digits
    named by its size (its repr raises)."""
    try:
        text = repr(value)
    except ValueError:
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else f"<a {type(value).__name__}>"
    return clip(text, limit)


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem: where (``file:line:col``, a flag, a config key, a rule id) and what; ``code`` a stable
    identifier (default: the raising error type's), ``help`` what to do about it."""

    where: str | None
    message: str
    code: str | None = None
    help: str | None = None

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        return visible(f"{text}\n    help: {self.help}" if self.help else text)


def bounded(problem: Problem) -> Problem:
    """``problem`` quoting at most MAX_QUOTED characters of the input in its ``where`` and in any word of its
    message; its message and help at most MAX_MESSAGE characters."""

    def bound(text: str | None) -> str | None:
        if text is None or len(text) <= MAX_QUOTED:
            return text
        return clip(_LONG_WORD.sub(lambda m: clip(m.group()), text), MAX_MESSAGE)

    where = clip(problem.where) if problem.where is not None else None
    shorter = Problem(where, bound(problem.message) or "", problem.code, bound(problem.help))
    return problem if shorter == problem else shorter


def listed(problems: Sequence[Problem]) -> tuple[list[Problem], int]:
    """The problems an error shows (the first MAX_PROBLEMS) and how many more it only counts, a trailing ``and N
    more problems`` of the caller's own (a loader that stopped collecting) included."""
    shown, more = list(problems), 0
    if shown and (found := _MORE.fullmatch(shown[-1].message)):
        shown, more = shown[:-1], int(found.group(1))
    return shown[:MAX_PROBLEMS], more + max(len(shown) - MAX_PROBLEMS, 0)


class AttngateError(Exception):
    """Base of every error attngate raises on bad input. ``problems`` lists every problem found, each with a code."""

    title = "attngate error"
    code = "attngate"  # the code of each problem that names none
    fields: tuple[tuple[str, str], ...] = ()  # (field, message) per problem, where a validated model raised it

    def __init__(self, problems: list[Problem] | Problem | str):
        if isinstance(problems, str):
            problems = [Problem(None, problems, code=self.code)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = [
            bounded(p if p.code else dataclasses.replace(p, code=self.code)) for p in problems
        ]
        super().__init__(visible(self._render()))  # controls and bidi characters of the input made visible

    def _render(self) -> str:
        shown, more = listed(self.problems)
        n = len(shown) + more
        head = f"{self.title} ({n} problem{'s' if n != 1 else ''}):"
        return "\n".join([head, *(f"  - {p}" for p in shown), *([f"  - and {more} more problems"] if more else [])])


class ServerArgsError(AttngateError):
    """Unknown or ill-typed server arguments (flags, args files, objects)."""

    title = "invalid server arguments"
    code = "server-args"


class ModelConfigError(AttngateError):
    """A Hugging Face config.json that is malformed or describes an unsupported attention layout."""

    title = "invalid model config"
    code = "model-config"


class PlatformError(AttngateError):
    """The GPU architecture is unknown or cannot be detected."""

    title = "invalid platform"
    code = "platform"


class RulesError(AttngateError):
    """A rules file that does not load or type-check; every problem has ``file:line:col``."""

    title = "invalid rules"
    code = "rules"


class UsageError(AttngateError, TypeError, ValueError):
    """A library call given a wrong argument (a dict where ServerArgs goes, one string where a list of names
    goes, a forward mode that does not exist): names the parameter and what it takes. Also a TypeError and a
    ValueError, as Python's own argument errors are."""

    title = "invalid call"
    code = "usage"


class KVCacheExhausted(AttngateError):
    """The KV pool (or the request table) has no room for an allocation."""

    title = "KV cache exhausted"
    code = "kv-cache-exhausted"


class BackendRefusal(AttngateError):
    """A backend refusing a plan or a model's layers at construction (attngate.backends.capabilities says why),
    before any kernel runs."""

    title = "backend refuses the plan"
    code = "backend-refusal"


class BatchMetadataError(AttngateError):
    """ForwardBatch metadata that would read or write outside the pool or the request table."""

    title = "invalid forward batch metadata"
    code = "batch-metadata"


class PlanLoadError(AttngateError):
    """A plan's JSON that does not load: not a Plan, or a fingerprint that does not match its content."""

    title = "invalid plan"
    code = "plan-load"


class PlanMismatchError(AttngateError):
    """Ranks of one server that resolved different plans (attngate.integrations.distributed): each problem names a
    rank that differs from rank 0, with the gates (and the facts behind them) that differ."""

    title = "ranks resolved different attention plans"
    code = "plan-mismatch"


class CaseFileError(AttngateError):
    """A conformance cases file (``attngate conform --cases``) that does not load: each problem names the case."""

    title = "invalid conformance cases"
    code = "conform-cases"


class SglangMissingError(AttngateError):
    """SGLang is not importable where a conformance check needs it (the sglang extra)."""

    title = "SGLang is not installed"
    code = "sglang-missing"


class SglangMismatchError(AttngateError):
    """attngate's plan and SGLang's resolution of the same arguments differ where no deviation declares it
    (attngate.integrations.sglang.verify): each problem names a differing field and both values."""

    title = "attngate's plan and SGLang's resolution disagree"
    code = "sglang-mismatch"


class ConditionError(Exception):
    """One problem in a rule condition, before it has a file location: ``col`` the column (0-based) of the
    condition text, ``message`` what is wrong, ``help`` what to do (a did-you-mean). attngate.rules.check turns each
    into a :class:`Problem` at ``file:line:col``."""

    def __init__(self, col: int, message: str, help: str | None = None):
        self.col = col
        self.message = message
        self.help = help
        super().__init__(message)

    def problem(self, where: str, label: str) -> Problem:
        """This error as a Problem at ``where`` (the condition's ``file:line:col``), its message under ``label``
        (``rule 'x'``, ``predicate 'p'``)."""
        return Problem(where, f"{label}: {self.message}", code="rules.condition", help=self.help)


class ConditionErrors(Exception):
    """Every :class:`ConditionError` of one condition (``errors``)."""

    def __init__(self, errors: list[ConditionError]):
        self.errors = errors
        super().__init__("; ".join(e.message for e in errors))


class Reason(Protocol):
    """What PlanError reads of each violation (attngate.engine.result.Violation)."""

    @property
    def where(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def issue(self) -> str | None: ...

    @property
    def help(self) -> str | None: ...


class PlanError(AttngateError):
    """The configuration is invalid. ``violations`` holds every reason (each problem's code is ``plan.<kind>``);
    ``server_args`` the adjusted arguments, ``adjustments`` the rewrites made before, ``deviations`` the rules
    file's deviations that declare SGLang 0.5.23 accepting this on purpose, ``candidates`` each candidate backend
    with the rules that refuse it (empty: it runs) where the backend is at issue."""

    title = "invalid configuration"
    code = "plan"

    def __init__(
        self,
        violations: Sequence[Reason],
        server_args: dict[str, Any] | None = None,
        adjustments: list[Any] | None = None,
        deviations: list[Any] | None = None,
        *,
        candidates: dict[str, list[str]] | None = None,
    ):
        self.violations = list(violations)
        self.server_args = server_args
        self.adjustments = adjustments or []
        self.deviations = deviations or []
        #: each candidate backend and the rules that refuse it here ([]: it runs), where the backend is what fails
        self.candidates = candidates or {}
        super().__init__(
            [
                Problem(
                    v.where,
                    v.message + (f" [{v.issue}]" if v.issue else ""),
                    f"plan.{getattr(v.kind, 'value', v.kind)}",
                    v.help,
                )
                for v in self.violations
            ]
        )

    def _render(self) -> str:
        text = super()._render()
        runs = [b for b, rules in self.candidates.items() if not rules]
        if not self.candidates:
            return text
        lines = [text, "candidate backends (--attention-backend, ServerArgs.attention_backend):"]
        lines += [
            f"  {b}: " + ("runs this" if not rules else "refused by " + ", ".join(rules))
            for b, rules in self.candidates.items()
        ]
        if runs:
            lines.append(f"  e.g. --attention-backend {runs[0]}, or ServerArgs(attention_backend={runs[0]!r})")
        return "\n".join(lines)


def check_arguments(*checks: tuple[str, object, type | tuple[type, ...], str]) -> None:
    """UsageError listing every ``(parameter, value, accepted types, how to build one)`` whose value is of
    none of the types; a ``str`` given where a list of names goes is refused by passing ``(list, tuple, ...)``."""
    problems = []
    for name, value, types, hint in checks:
        if not isinstance(value, types):
            accepted = " or ".join(_type_name(t) for t in (types if isinstance(types, tuple) else (types,)))
            problems.append(
                Problem(
                    name,
                    f"takes {accepted}, not {_type_name(type(value))}" + (f"; {hint}" if hint else ""),
                    code="usage.argument-type",
                )
            )
    if problems:
        raise UsageError(problems)


def _type_name(t: type) -> str:
    return "None" if t is type(None) else t.__name__


def argument_problems(*checks: tuple[str, object, type | tuple[type, ...], str]) -> list[Problem]:
    """The problems :func:`check_arguments` would raise, as a list (empty: every argument is of its types), for a
    caller that gathers them with other checks of its own."""
    try:
        check_arguments(*checks)
    except UsageError as err:
        return err.problems
    return []


def count_problems(*checks: tuple[str, object, int]) -> list[Problem]:
    """A Problem per ``(parameter, value, least)`` whose value is no integer (``int`` or one with ``__index__``, such
    as numpy's; a bool is none) or is below ``least``."""
    return [
        Problem(name, f"takes an integer >= {least}, not {value!r}", code="usage.count")
        for name, value, least in checks
        if isinstance(value, bool) or not hasattr(type(value), "__index__") or operator.index(value) < least
    ]


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
