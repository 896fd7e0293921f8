"""What resolve() returns besides the Plan: adjustments, violations (raised in attngate.errors.PlanError), and the
explanation of every value."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable

from attngate.facts.model import ModelFacts
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.plan.schema import Plan
from attngate.types import VerdictStatus, ViolationKind, ViolationSource


@dataclass(frozen=True, slots=True)
class Adjustment:
    """A server argument rewritten by an ``adjust`` rule (or a ``known_failure`` fallback); always a warning."""

    rule: str
    field: str
    old: Any
    new: Any
    message: str
    issue: str | None = None

    @property
    def fills_default(self) -> bool:
        """True when the argument was unset (None) and the rule chose its value."""
        return self.old is None

    def __str__(self) -> str:
        tail = f" [{self.issue}]" if self.issue else ""
        return f"{self.field}: {self.old!r} -> {self.new!r} ({self.rule}: {self.message}){tail}"


@dataclass(frozen=True, slots=True)
class Violation:
    """Why a configuration cannot be resolved. ``source`` says who: one rule (``rule`` is its id), several rules
    together (a conflict or an oscillation: ``rules``), the engine itself, or an argument of resolve()."""

    message: str
    kind: ViolationKind
    source: ViolationSource
    rules: tuple[str, ...] = ()  # the rule ids involved; empty for the engine and arguments
    facts: dict[str, Any] = field(default_factory=dict)  # what the rule's condition read
    issue: str | None = None
    help: str | None = None
    argument: str | None = None  # the argument of resolve() at fault (source ARGUMENT)

    @classmethod
    def of_rule(cls, rule: str, message: str, kind: ViolationKind, **extra: Any) -> Violation:
        return cls(message, kind, ViolationSource.RULE, (rule,), **extra)

    @classmethod
    def of_rules(cls, rules: Iterable[str], message: str, kind: ViolationKind) -> Violation:
        return cls(message, kind, ViolationSource.RULES, tuple(dict.fromkeys(rules)))

    @classmethod
    def of_engine(cls, message: str, kind: ViolationKind, help: str | None = None) -> Violation:
        return cls(message, kind, ViolationSource.ENGINE, help=help)

    @classmethod
    def of_argument(cls, argument: str, message: str, help: str | None = None) -> Violation:
        return cls(message, ViolationKind.BAD_ARGUMENT, ViolationSource.ARGUMENT, help=help, argument=argument)

    @property
    def rule(self) -> str | None:
        """The id of the one rule at fault (source RULE), else None."""
        return self.rules[0] if self.source == ViolationSource.RULE else None

    @property
    def where(self) -> str:
        """Its label in messages: the rule ids, ``attngate`` for the engine, or the argument's name."""
        if self.rules:
            return " vs ".join(self.rules)
        return self.argument if self.source == ViolationSource.ARGUMENT and self.argument else "attngate"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A rule that could have set a gate but did not match, with its conjuncts that were false."""

    rule: str
    failed: list[str]


@dataclass(frozen=True, slots=True)
class GateExplanation:
    """Where a gate's value came from: rule id(s), ``default``, or ``fact:<name>``."""

    value: Any
    origin: str
    rules: list[str]
    facts: dict[str, Any]  # values of every fact the deciding (or candidate) conditions read
    candidates: list[Candidate]


@dataclass(frozen=True, slots=True)
class BackendVerdict:
    """A candidate backend evaluated for this configuration: chosen, accepted, or rejected with every reason."""

    backend: str
    status: VerdictStatus
    reasons: list[str]


@dataclass(frozen=True)
class Explanation:
    gates: dict[str, GateExplanation]
    modes: dict[str, dict[str, GateExplanation]]
    layers: dict[str, dict[str, GateExplanation]]
    backends: list[BackendVerdict]


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """The result of :func:`attngate.resolve`: the Plan plus everything needed to explain it (built by keyword)."""

    plan: Plan
    server_args: ServerArgs  # after adjustment
    requested_args: ServerArgs
    model: ModelFacts
    platform: Platform
    adjustments: list[Adjustment]
    _explain: Any = field(repr=False, compare=False)  # builds the Explanation on first use
    allowed_known_failures: list[Violation] = field(default_factory=list)  # matched, and opted into by the caller
    deviations: list[Any] = field(
        default_factory=list
    )  # rules.deviations.Deviation: where SGLang 0.5.23 differs on purpose
    #: (backend, violations) where the default backend the rules chose was refused and resolve() fell back to the
    #: first candidate that runs (attngate.engine.fallback); None otherwise
    default_refusal: tuple[str, tuple[Violation, ...]] | None = None

    @property
    def warnings(self) -> list[str]:
        """Adjustments that rewrote a value the user set (or an earlier rule chose), and allowed known failures."""
        return [str(a) for a in self.adjustments if not a.fills_default] + [
            f"known failure {v.rule} allowed: {v.message}" + (f" ({v.issue})" if v.issue else "")
            for v in self.allowed_known_failures
        ]

    @property
    def explanation(self) -> Explanation:
        return self._explain()

    @property
    def forward_modes(self) -> tuple[ForwardMode, ...]:
        """The forward modes this server can run (the Plan's tables hold every mode): EXTEND always; DECODE unless
        it serves embeddings or the model only encodes; IDLE under DP attention (a rank without requests pads);
        TARGET_VERIFY and DRAFT_EXTEND_V2 with speculative decoding."""
        args, kinds = self.server_args, set(self.model.layer_kinds)
        modes = [ForwardMode.EXTEND]
        if not args.is_embedding and kinds != {LayerKind.ENCODER_ONLY}:
            modes.append(ForwardMode.DECODE)
        if args.speculative_algorithm is not None:
            modes += [ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2]
        if args.enable_dp_attention:
            modes.append(ForwardMode.IDLE)
        return tuple(modes)

    def __reduce__(self) -> tuple:
        """Pickles with its explanation built (the builder is a closure over the engine's state): a Resolution
        travels to another process (a server's scheduler or TP workers) whole."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return (_resolution, ({**fields, "_explain": _Built(self.explanation)},))


def _resolution(fields: dict[str, Any]) -> Resolution:
    """A Resolution from its fields by name (it is built by keyword only): what unpickling calls."""
    return Resolution(**fields)


@dataclass(frozen=True)
class _Built:
    """An explanation already built, standing in for the builder after unpickling."""

    explanation: Explanation

    def __call__(self) -> Explanation:
        return self.explanation
