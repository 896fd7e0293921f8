"""``deviations:`` in a rules file: where attngate differs from SGLang 0.5.23 on purpose.

Each deviation states one cause: the server arguments whose values differ through it, ``refusal`` (attngate
refuses through the rules it lists, where SGLang accepts) and ``sglang_refusal`` (SGLang refuses, attngate
accepts); the configurations it covers (``when``, read on the arguments as the user gave them, before any
adjust rule, with the model and platform facts and the file's predicates), the reason and the source.
``attngate conform`` counts a difference as declared only where a deviation of that field matches; an attngate
refusal is declared where the matching deviations name, together, every rule it refused through. ``explain``
shows the deviations that apply; ``lint`` checks that each can hold, that no two overlap and that none of values
holds for every configuration (attngate.analysis.deviation_lint).

Loading refuses a deviation that could hide what it does not name: one of no field (``fields: []``) or of a field
twice, one of values or ``sglang_refusal`` with ``when: true`` or no ``when`` (it would excuse every such difference),
and a refusal deviation naming a rule that never refuses (kind set or adjust, a known_failure with a fallback) or
none at all. :class:`DeviationCoverage` says which deviations a corpus of cases exercises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attngate.errors import Problem
from attngate.facts.catalogue import FACTS, base_facts
from attngate.facts.model import ModelFacts
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.rules.condition import Condition, compile_condition
from attngate.util.suggest import suggestion

if TYPE_CHECKING:
    from attngate.rules.spec import DeviationSpec
    from attngate.types import FactType
    from attngate.util.yaml_source import YamlDocument

REFUSAL = "refusal"  # attngate refuses what SGLang accepts
SGLANG_REFUSAL = "sglang_refusal"  # SGLang refuses what attngate accepts
DEVIATION_FIELDS: tuple[str, ...] = (REFUSAL, SGLANG_REFUSAL, *ServerArgs.model_fields)


@dataclass(frozen=True, slots=True)
class Deviation:
    """A loaded deviation; ``where`` is its ``file:line:col``."""

    id: str
    fields: tuple[str, ...]
    reason: str
    source: str
    where: str
    condition: Condition
    rules: tuple[str, ...] = ()


def check_deviations(
    raw: Any, doc: YamlDocument, problems: list[Problem], predicate_types: dict[str, FactType]
) -> list[Deviation]:
    """Type-check the ``deviations:`` list; every problem goes to ``problems`` with file:line:col."""
    # imported here: a rule set read from the disk cache (attngate.rules.cache) is never checked again
    from attngate.rules.entries import validated_entries
    from attngate.rules.spec import DeviationSpec
    from attngate.rules.typecheck import ConditionErrors

    readable = {**{name: spec.type for name, spec in FACTS.items()}, **predicate_types}
    out: list[Deviation] = []
    for path, spec in validated_entries(raw, doc, problems, DeviationSpec, "deviations", "deviation"):
        fields = (spec.fields,) if isinstance(spec.fields, str) else tuple(spec.fields)
        unknown = [f for f in fields if f not in DEVIATION_FIELDS]
        for name in unknown:
            problems.append(
                Problem(
                    doc.where(path + ("fields",)),
                    f"deviation {spec.id!r}: {name!r} is neither a server argument nor refusal / sglang_refusal",
                    help=suggestion(name, DEVIATION_FIELDS),
                    code="rules.deviation-field",
                )
            )
        if bool(spec.rules) != (REFUSAL in fields):
            problems.append(
                Problem(
                    doc.where(path + ("rules",) if spec.rules else path + ("fields",)),
                    f"deviation {spec.id!r}: fields: refusal (attngate refuses) goes with rules: the "
                    "refusing rules it declares, and rules: with fields: refusal",
                    code="rules.deviation-refusal",
                )
            )
        problems += _unbounded(spec, fields, doc, path) + _not_refusing(spec, doc, path)
        if unknown or not fields:
            continue
        text = spec.when if isinstance(spec.when, str) else str(spec.when)
        try:
            condition = compile_condition(text, readable)
        except ConditionErrors as exc:
            problems += [
                err.problem(doc.where(path + ("when",), err.col), f"deviation {spec.id!r}") for err in exc.errors
            ]
            continue
        out.append(
            Deviation(
                spec.id, fields, spec.reason, spec.source, doc.where(path + ("id",)), condition, tuple(spec.rules)
            )
        )
    return out


def _unbounded(spec: DeviationSpec, fields: tuple[str, ...], doc: YamlDocument, path: tuple) -> list[Problem]:
    """A deviation of values or of SGLang's refusals whose ``when`` is ``true`` (or left out) would excuse every such
    difference of every configuration. A refusal deviation alone may hold everywhere: its rules bound it."""
    if spec.when is not True or not set(fields) - {REFUSAL}:
        return []
    given = "when" in spec.model_fields_set
    return [
        Problem(
            doc.where(path + ("when",) if given else path + ("id",)),
            f"deviation {spec.id!r}: declares {', '.join(f for f in fields if f != REFUSAL)} "
            + ("with when: true" if given else "without a when")
            + ", which would excuse every such difference of every configuration",
            help="state the configurations it covers in `when`",
            code="rules.deviation-unbounded",
        )
    ]


def _not_refusing(spec: DeviationSpec, doc: YamlDocument, path: tuple) -> list[Problem]:
    """The rules a refusal deviation names that never refuse: of kind set or adjust, or a known_failure with a
    ``fallback`` (it adjusts instead). Read from the document's ``rules:`` as written (an unknown id is loading's)."""
    raw = doc.data.get("rules") if isinstance(doc.data, dict) else None
    kinds = {}
    for item in raw if isinstance(raw, list) else ():
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            kind = item.get("kind", "set")
            if not isinstance(kind, str):  # the rule's own schema error
                continue
            kinds[item["id"]] = (
                # the engine reads `fallback: null` or `{}` as none: such a rule refuses
                "known_failure with a fallback" if kind == "known_failure" and item.get("fallback") else kind
            )
    return [
        Problem(
            doc.where(path + ("rules", index)),
            f"deviation {spec.id!r}: rule {rule!r} is of kind {kinds[rule]}, which never refuses a configuration; "
            "fields: refusal names forbid and known_failure rules (without a fallback)",
            code="rules.deviation-rule-kind",
        )
        for index, rule in enumerate(spec.rules)
        if kinds.get(rule, "forbid") not in ("forbid", "known_failure")
    ]


def given_facts(rules: Any, args: ServerArgs, model: ModelFacts, platform: Platform) -> dict[str, Any]:
    """The facts a deviation's ``when`` reads: the arguments as given, the model, the platform, the predicates."""
    return rules.with_predicates(base_facts(args, model, platform))


def refusing_rules(violations: list[Any]) -> frozenset[str]:
    """The rules a refusal is declared by: its violations' rules, less adjust conflicts where a forbid rule also
    matched (the conflict follows from what the forbid rule refuses). A violation no rule makes (the engine's, an
    argument's) counts under its label, which no deviation names: such a refusal is never declared."""
    causes = [v for v in violations if v.kind != "conflict"] or violations
    return frozenset(r for v in causes for r in (v.rules or (v.where,)))


def applicable_deviations(
    rules: Any, facts: dict[str, Any], refused_by: frozenset[str] = frozenset()
) -> list[Deviation]:
    """The deviations of ``rules`` that hold under ``facts`` (:func:`given_facts`) and declare something of this
    outcome. ``refused_by``: the rules through which attngate refused the configuration (empty: it accepted). A
    refusal is declared by the matching deviations that name its rules, and only where they name every one of
    ``refused_by`` between them; an accepted configuration by those with value fields or ``sglang_refusal``."""
    held = [d for d in rules.deviations if d.condition(facts)]
    if not refused_by:
        return [d for d in held if set(d.fields) - {REFUSAL}]
    naming = [d for d in held if refused_by & set(d.rules)]
    return naming if refused_by <= {rule for d in naming for rule in d.rules} else []


def matching_deviations(
    rules: Any, args: ServerArgs, model: ModelFacts, platform: Platform, refused_by: frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    """``{field: [deviation ids]}`` of :func:`applicable_deviations` for this configuration: for a refusal by
    attngate only ``refusal``, else every field but ``refusal``."""
    if not rules.deviations:
        return {}
    out: dict[str, list[str]] = {}
    for deviation in applicable_deviations(rules, given_facts(rules, args, model, platform), refused_by):
        for name in deviation.fields:
            if (name == REFUSAL) == bool(refused_by):
                out.setdefault(name, []).append(deviation.id)
    return out


@dataclass
class DeviationCoverage:
    """Which deviations of ``rules`` a corpus of configurations exercises: a deviation is exercised by a case where it
    applies to attngate's outcome (:func:`applicable_deviations`); a refusal deviation's rule by a case refused through
    it where the deviation applies. Fed per case with :meth:`record`; tests/rules/test_deviation_checks.py runs the
    generated conformance corpus through it (attngate's side only, no SGLang)."""

    rules: Any
    cases: dict[str, list[str]] = field(default_factory=dict)  # deviation id -> the cases it applied to
    refused_through: dict[str, set[str]] = field(default_factory=dict)  # deviation id -> its rules that refused

    def record(self, case: str, facts: dict[str, Any], refused_by: frozenset[str] = frozenset()) -> list[Deviation]:
        """The deviations applicable to one case (``facts``: :func:`given_facts`; ``refused_by``: the rules attngate
        refused it through, empty where it accepted), noted as exercised."""
        applied = applicable_deviations(self.rules, facts, refused_by)
        for deviation in applied:
            self.cases.setdefault(deviation.id, []).append(case)
            self.refused_through.setdefault(deviation.id, set()).update(refused_by & set(deviation.rules))
        return applied

    def never_applied(self) -> list[Deviation]:
        """The deviations no recorded case made applicable."""
        return [d for d in self.rules.deviations if d.id not in self.cases]

    def rules_never_refusing(self) -> dict[str, list[str]]:
        """Per refusal deviation, the rules it names that no recorded case where it applied was refused through."""
        out = {}
        for d in self.rules.deviations:
            missing = [r for r in d.rules if r not in self.refused_through.get(d.id, ())]
            if missing:
                out[d.id] = missing
        return out

    def report(self) -> dict[str, Any]:
        """Counts and what is missing, as rule coverage reports it (attngate.testing.coverage)."""
        return {
            "deviations": len(self.rules.deviations),
            "exercised": {d.id: len(self.cases[d.id]) for d in self.rules.deviations if d.id in self.cases},
            "never_applied": [{"deviation": d.id, "where": d.where} for d in self.never_applied()],
            "rules_never_refusing": self.rules_never_refusing(),
        }
