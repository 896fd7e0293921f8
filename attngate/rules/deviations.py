"""``deviations:`` in a rules file: where attngate differs from SGLang 0.5.23 on purpose.

Each deviation names one server argument (or ``refusal``: one side refuses what the other accepts), the
configurations it covers (``when``, read on the arguments as the user gave them, before any adjust rule,
with the model and platform facts and the file's predicates), the reason and the source. ``attngate conform``
counts a difference as declared only where a deviation of that field matches; ``explain`` shows the
deviations that apply; ``lint`` checks that each can hold and that no two of one field overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attngate._suggest import did_you_mean
from attngate.errors import Problem
from attngate.facts.model import ModelFacts
from attngate.facts.platform import Platform
from attngate.facts.schema import FACTS, FactType, base_facts
from attngate.facts.server_args import ServerArgs
from attngate.rules.condition import Condition, ConditionErrors, compile_condition
from attngate.rules.entries import validated_entries
from attngate.rules.spec import DeviationSpec
from attngate.rules.yaml_source import YamlDocument

REFUSAL = "refusal"
DEVIATION_FIELDS: tuple[str, ...] = (REFUSAL, *ServerArgs.model_fields)


@dataclass(frozen=True, slots=True)
class Deviation:
    """A loaded deviation; ``where`` is its ``file:line:col``."""

    id: str
    field: str
    reason: str
    source: str
    where: str
    condition: Condition
    rules: tuple[str, ...] = ()


def check_deviations(raw: Any, doc: YamlDocument, problems: list[Problem], predicate_types: dict[str, FactType]) -> list[Deviation]:
    """Type-check the ``deviations:`` list; every problem goes to ``problems`` with file:line:col."""
    readable = {**{name: spec.type for name, spec in FACTS.items()}, **predicate_types}
    out: list[Deviation] = []
    for path, spec in validated_entries(raw, doc, problems, DeviationSpec, "deviations", "deviation"):
        if spec.field not in DEVIATION_FIELDS:
            problems.append(Problem(doc.where(path + ("field",)), f"deviation {spec.id!r}: {spec.field!r} is neither a server "
                                    "argument nor 'refusal'" + did_you_mean(spec.field, DEVIATION_FIELDS)))
            continue
        if spec.rules and spec.field != REFUSAL:
            problems.append(Problem(doc.where(path + ("rules",)), f"deviation {spec.id!r}: rules: names attngate's refusing "
                                    "rules, so it needs field: refusal"))
        text = spec.when if isinstance(spec.when, str) else str(spec.when)
        try:
            condition = compile_condition(text, readable)
        except ConditionErrors as exc:
            for err in exc.errors:
                problems.append(Problem(doc.where(path + ("when",), err.col), f"deviation {spec.id!r}: {err.message}"))
            continue
        out.append(Deviation(spec.id, spec.field, spec.reason, spec.source, doc.where(path + ("id",)), condition,
                             tuple(spec.rules)))
    return out


def given_facts(rules: Any, args: ServerArgs, model: ModelFacts, platform: Platform) -> dict[str, Any]:
    """The facts a deviation's ``when`` reads: the arguments as given, the model, the platform, the predicates."""
    return rules.with_predicates(base_facts(args, model, platform))


def matching_deviations(rules: Any, args: ServerArgs, model: ModelFacts, platform: Platform,
                        refused_by: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """``{field: [deviation ids]}`` of every deviation of ``rules`` whose condition holds for this configuration.
    ``refused_by``: the rules through which attngate refused it (empty: attngate accepted). A refusal deviation with
    ``rules`` covers an attngate refusal whose rules are all among them; one without covers an SGLang refusal."""
    facts = given_facts(rules, args, model, platform) if rules.deviations else {}
    out: dict[str, list[str]] = {}
    for deviation in rules.deviations:
        if deviation.field == REFUSAL and bool(deviation.rules) != bool(refused_by):
            continue
        if deviation.rules and not refused_by <= set(deviation.rules):
            continue
        if deviation.condition(facts):
            out.setdefault(deviation.field, []).append(deviation.id)
    return out
