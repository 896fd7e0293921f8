"""Type-checking a rules document: every rule's schema, scope, condition and values against the fact catalogue and
the gate registry, every problem collected with ``file:line:col``."""

from __future__ import annotations

import dataclasses
import keyword
import re
from typing import Any

from pydantic import ValidationError

from attngate.errors import Problem
from attngate.facts.catalogue import FACTS, LAYER_FACT, MODE_FACT
from attngate.facts.server_args import ServerArgs
from attngate.plan.registry import GATES
from attngate.rules.condition import Condition, compile_condition
from attngate.rules.entries import pydantic_problems
from attngate.rules.ruleset import FactValue, Predicate, Rule
from attngate.rules.spec import RuleFileSpec, RuleSpec
from attngate.rules.typecheck import ConditionErrors
from attngate.types import FactType, Scope
from attngate.util.suggest import suggestion
from attngate.util.yaml_source import YamlDocument

_PREDICATE_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_GLOBAL_FACT_TYPES = {name: spec.type for name, spec in FACTS.items()}
_ADJUSTABLE = {name: FACTS[name].type for name in ServerArgs.model_fields}
_GLOBAL_GATE_TYPES = {name: g.type for name, g in GATES.items() if g.scope == "global"}
_SCOPE_FACTS: dict[Scope, dict[str, FactType]] = {
    "global": _GLOBAL_FACT_TYPES,
    "mode": {**_GLOBAL_FACT_TYPES, MODE_FACT.name: MODE_FACT.type},
    "layer": {**_GLOBAL_FACT_TYPES, LAYER_FACT.name: LAYER_FACT.type},
}
_SCOPE_HINTS = {
    MODE_FACT.name: " (readable only by rules that set per-mode gates)",
    LAYER_FACT.name: " (readable only by rules that set per-layer gates)",
}


def check_document(doc: YamlDocument, problems: list[Problem]) -> tuple[list[Rule], list[Predicate]]:
    data = doc.data
    if not isinstance(data, dict):
        problems.append(
            Problem(
                doc.where(()),
                "a rules file is a mapping with 'version: 1' and 'rules: [...]'",
                code="rules.not-mapping",
            )
        )
        return [], []
    try:  # each entry is checked on its own below; a section that is no list (null included) is the schema's error
        RuleFileSpec.model_validate(
            {**data, "rules": []} | {k: [] for k in ("invariants", "deviations") if isinstance(data.get(k, []), list)}
        )
    except ValidationError as exc:
        pydantic_problems(exc, doc, (), problems, RuleFileSpec)
    predicates = _check_predicates(data.get("predicates"), doc, problems)
    fact_types = {p.name: FactType("bool") for p in predicates}
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list):
        if "rules" in data:
            problems.append(Problem(doc.where(("rules",)), "'rules' must be a list", code="rules.not-list"))
        return [], predicates
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for index, raw in enumerate(raw_rules):
        path = ("rules", index)
        spec = _validate_spec(raw, doc, path, problems)
        if spec is None:
            continue
        if spec.id in seen:
            problems.append(
                Problem(
                    doc.where(path + ("id",)),
                    f"duplicate rule id {spec.id!r} (first at {seen[spec.id]})",
                    code="rules.duplicate-id",
                )
            )
        seen.setdefault(spec.id, doc.where(path + ("id",)))
        rule = _check_rule(spec, doc, path, problems, fact_types)
        if rule is not None:
            rules.append(rule)
    return rules, predicates


def _check_predicates(raw: Any, doc: YamlDocument, problems: list[Problem]) -> list[Predicate]:
    if not isinstance(raw, dict):
        return []  # a wrong type was already reported by the file schema
    predicates: list[Predicate] = []
    readable = dict(_GLOBAL_FACT_TYPES)
    for name, text in raw.items():
        path = ("predicates", name)
        if not isinstance(name, str) or not _PREDICATE_NAME.fullmatch(name) or keyword.iskeyword(name):
            # ASCII only: Python reads identifiers NFKC-normalised, so a fullwidth name would read the fact it spells
            problems.append(
                Problem(
                    doc.where(path),
                    f"predicate name {name!r} must be a lower-case ASCII identifier (a-z, 0-9, _) and no keyword",
                    code="rules.predicate-name",
                )
            )
            continue
        if name in readable:
            problems.append(
                Problem(
                    doc.where(path),
                    f"predicate {name!r} shadows a fact or an earlier predicate",
                    code="rules.predicate-shadows",
                )
            )
            continue
        try:
            condition = compile_condition(text, readable, None, _SCOPE_HINTS)
        except ConditionErrors as exc:
            problems += [err.problem(doc.where(path, err.col), f"predicate {name!r}") for err in exc.errors]
            continue
        readable[name] = FactType("bool")
        predicates.append(Predicate(name, condition, doc.where(path)))
    return predicates


def _validate_spec(raw: Any, doc: YamlDocument, path: tuple, problems: list[Problem]) -> RuleSpec | None:
    """Validate one rule; unknown keys are reported and dropped so the rest is still checked."""
    try:
        return RuleSpec.model_validate(raw)
    except ValidationError as exc:
        pydantic_problems(exc, doc, path, problems, RuleSpec)
        unknown = {e["loc"][0] for e in exc.errors() if e["type"] == "extra_forbidden"}
        if not unknown or len(unknown) != len(exc.errors()):
            return None
    try:
        return RuleSpec.model_validate({k: v for k, v in raw.items() if k not in unknown})
    except ValidationError:
        return None


_KIND_FIELDS: dict[str, tuple[set[str], set[str]]] = {  # kind -> (required, allowed-extra)
    "set": ({"set_"}, {"message"}),
    "adjust": ({"adjust", "message"}, set()),
    "forbid": ({"message"}, set()),
    "known_failure": ({"message", "issue"}, {"fallback"}),
}
_OPTIONAL = {"set_", "adjust", "fallback", "message", "issue"}


def _check_rule(
    spec: RuleSpec, doc: YamlDocument, path: tuple, problems: list[Problem], predicate_types: dict[str, FactType]
) -> Rule | None:
    start = len(problems)
    required, extra = _KIND_FIELDS[spec.kind]
    for name in sorted(_OPTIONAL):
        key = "set" if name == "set_" else name
        present = getattr(spec, name) is not None
        if name in required and not present:
            problems.append(
                Problem(doc.where(path), f"rule {spec.id!r}: kind {spec.kind} needs '{key}'", code="rules.missing-key")
            )
        elif present and name not in required | extra:
            problems.append(
                Problem(
                    doc.where(path + (key,)),
                    f"rule {spec.id!r}: '{key}' does not belong to kind {spec.kind}",
                    code="rules.extra-key",
                )
            )
    scope = _scope_of(spec, doc, path, problems)
    sets = _check_values(spec.set_ or {}, GATES_TYPES.get(scope, {}), "gate", doc, path + ("set",), problems)
    adjusts = _check_values(
        {**(spec.adjust or {}), **(spec.fallback or {})},
        _ADJUSTABLE,
        "server argument",
        doc,
        path + ("adjust" if spec.adjust else "fallback",),
        problems,
    )
    condition = _check_condition(spec, scope, doc, path, problems, predicate_types)
    if len(problems) > start or condition is None:
        return None
    return Rule(
        id=spec.id,
        kind=spec.kind,
        summary=spec.summary,
        why=spec.why,
        source=spec.source,
        where=doc.where(path),
        condition=condition,
        scope=scope,
        sets=sets,
        adjusts=adjusts,
        message=spec.message,
        issue=spec.issue,
        backends=tuple(spec.backends or ()),
    )


def _scope_of(spec: RuleSpec, doc: YamlDocument, path: tuple, problems: list[Problem]) -> Scope:
    scopes = {GATES[name].scope for name in (spec.set_ or {}) if name in GATES}
    if len(scopes) > 1:
        problems.append(
            Problem(
                doc.where(path + ("set",)),
                f"rule {spec.id!r} sets gates of different scopes {sorted(scopes)}; split it",
                code="rules.mixed-scopes",
            )
        )
    return scopes.pop() if len(scopes) == 1 else "global"


GATES_TYPES: dict[Scope, dict[str, FactType]] = {
    scope: {n: g.type for n, g in GATES.items() if g.scope == scope} for scope in ("global", "mode", "layer")
}


def _check_values(
    values: dict[str, Any],
    types: dict[str, FactType],
    what: str,
    doc: YamlDocument,
    path: tuple,
    problems: list[Problem],
) -> dict[str, Any]:
    out = dict(values)
    for name, value in values.items():
        where = doc.where(path + (name,))
        ftype = types.get(name)
        if ftype is None:
            other = GATES.get(name)
            hint = f"{name} is a {other.scope} gate" if other and what == "gate" else suggestion(str(name), types)
            problems.append(Problem(where, f"unknown {what} {name!r}", code="rules.unknown-name", help=hint))
        elif isinstance(value, dict) and what == "server argument":
            out[name] = _fact_value(name, value, ftype, where, problems)
        elif not ftype.accepts(value):
            problems.append(
                Problem(
                    where,
                    f"{name} is {ftype.describe()}, got {value!r}",
                    code="rules.value-type",
                    help=suggestion(value, map(str, ftype.choices))
                    if ftype.choices and isinstance(value, str)
                    else None,
                )
            )
    return out


def _fact_value(name: str, value: dict, ftype: FactType, where: str, problems: list[Problem]) -> FactValue | None:
    """``{from: FACT}``: FACT must be a global fact whose values ``name`` accepts."""
    fact = value.get("from") if set(value) == {"from"} else None
    if not isinstance(fact, str):
        problems.append(
            Problem(
                where, f"{name}: a computed value is written {{from: FACT}}, got {value!r}", code="rules.computed-value"
            )
        )
        return None
    source = _GLOBAL_FACT_TYPES.get(fact)
    if source is None:
        problems.append(
            Problem(
                where,
                f"{name}: unknown fact {fact!r}",
                help=suggestion(fact, _GLOBAL_FACT_TYPES),
                code="rules.unknown-fact",
            )
        )
        return None
    choices_fit = not ftype.choices or (source.choices is not None and set(source.choices) <= set(ftype.choices))
    if source.base != ftype.base or (source.optional and not ftype.optional) or not choices_fit:
        problems.append(
            Problem(
                where, f"{name} is {ftype.describe()}; fact {fact} is {source.describe()}", code="rules.computed-type"
            )
        )
        return None
    return FactValue(fact)


def _check_condition(
    spec: RuleSpec,
    scope: Scope,
    doc: YamlDocument,
    path: tuple,
    problems: list[Problem],
    predicate_types: dict[str, FactType],
) -> Condition | None:
    text = spec.when if isinstance(spec.when, str) else str(spec.when)
    if spec.backends:
        names = ", ".join(f'"{b}"' for b in spec.backends) + ("," if len(spec.backends) == 1 else "")
        text = f"(prefill_backend in ({names}) or decode_backend in ({names})) and ({text})"
    gates = _GLOBAL_GATE_TYPES if scope != "global" else None
    try:
        condition = compile_condition(text, {**_SCOPE_FACTS[scope], **predicate_types}, gates, _SCOPE_HINTS)
    except ConditionErrors as exc:
        shift = len(text) - len(spec.when if isinstance(spec.when, str) else text)
        for err in exc.errors:
            offset = err.col - (shift - 1) if spec.backends else err.col  # text = prefix + "(" + when + ")"
            problems.append(err.problem(doc.where(path + ("when",), max(offset, 0)), f"rule {spec.id!r}"))
        return None
    if spec.backends:  # show the synthesized conjunct as the user wrote it
        first = condition.conjuncts[0].with_text(f"backends: [{', '.join(spec.backends)}]")
        condition = dataclasses.replace(condition, conjuncts=(first, *condition.conjuncts[1:]))
    return condition
