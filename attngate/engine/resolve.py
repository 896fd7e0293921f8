"""``resolve()``: server args + model facts + platform + rules -> a frozen, explained Plan.

Semantics (DESIGN.md, "Resolution semantics"):

1. ``adjust`` rules (and ``known_failure`` rules with a ``fallback``) run to a fixed point. Every
   iteration evaluates all of them on the same state and applies their changes together, so the
   order of rules in the file cannot change the result. Two rules asking one argument for different
   values is a conflict; a state that repeats is an oscillation; both name the rules involved.
2. ``forbid`` and ``known_failure`` rules are checked on the adjusted arguments; every violation is
   collected into one :class:`PlanError`.
3. Each gate takes the value its matching ``set`` rules give it (two different values: a conflict),
   else its default. Global gates first; then per-mode and per-layer tables, whose rules may read the
   resolved global gates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Collection, Iterable

from attngate.engine.result import (
    Adjustment,
    BackendVerdict,
    Candidate,
    Explanation,
    GateExplanation,
    PlanError,
    Resolution,
    Violation,
)
from attngate.errors import check_arguments
from attngate.facts.catalogue import FACTS, base_facts, derived_facts
from attngate.facts.choices import CANDIDATE_BACKENDS
from attngate.facts.model import ModelFacts
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.plan.registry import GATES, GateSpec
from attngate.plan.schema import LayerGates, LayerTable, ModeGates, ModeTable, Plan
from attngate.rules.condition import gate_key
from attngate.rules.deviations import applicable_deviations, refusing_rules
from attngate.rules.load import FactValue, Rule, RuleSet, adjust_value, load_rules
from attngate.util.suggest import did_you_mean

MAX_ADJUST_ROUNDS = 32
#: Called as ``observer(rules, scope, facts)`` with every evaluation context of every resolve() (scope
#: "adjust" per adjustment round, "global", then "mode" per forward mode and "layer" per layer kind);
#: rule coverage listens here.
OBSERVERS: list[Callable[[RuleSet, str, dict[str, Any]], None]] = []
#: Called with the rule set and the deviations that apply to each configuration resolved (rule coverage).
DEVIATION_OBSERVERS: list[Callable[[RuleSet, list[Any]], None]] = []
_BACKEND_ARGS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


def resolve(
    server_args: ServerArgs,
    model: ModelFacts,
    platform: Platform,
    rules: RuleSet | None = None,
    *,
    allow_known_failures: Collection[str] = (),
) -> Resolution:
    """Resolve the attention Plan for one server configuration.

    Args:
        server_args: the requested arguments (``None`` fields are filled by rules).
        model: facts read from the model's config.json.
        platform: the GPU architecture.
        rules: a loaded RuleSet; default: the shipped ``rules.yaml``.
        allow_known_failures: ids of ``known_failure`` rules the caller accepts (e.g. to reproduce one):
            a match becomes a warning instead of an error. An id that names no known_failure rule is an error.

    Returns a :class:`Resolution` (``.plan``, adjusted ``.server_args``, ``.adjustments``,
    ``.explanation``). Raises :class:`PlanError` with every violation when the configuration is invalid, and
    :class:`attngate.errors.UsageError` naming every argument of the wrong type.
    """
    check_arguments(
        ("server_args", server_args, ServerArgs, "ServerArgs(...) or ServerArgs.from_object(sglang_server_args)"),
        ("model", model, ModelFacts, "ModelFacts.from_hf_config(path)"),
        ("platform", platform, Platform, "Platform.from_name('sm90') or Platform.detect()"),
        ("rules", rules, (RuleSet, type(None)), "load_rules(path), or None for the shipped rules"),
        (
            "allow_known_failures",
            allow_known_failures,
            (list, tuple, set, frozenset),
            "a list of known_failure ids, even for one",
        ),
    )
    rules = rules or load_rules()
    index = _index(rules)
    allowed = _check_allowed(rules, allow_known_failures)
    fixed = base_facts(server_args, model, platform)
    given = rules.with_predicates(fixed) if rules.deviations else {}
    try:
        args_state, adjustments = _adjust(server_args.model_dump(), fixed, index)
    except PlanError as err:  # adjust rules in conflict, or a value out of its type: SGLang may still accept it
        err.deviations = _deviations(rules, given, refusing_rules(err.violations))
        raise
    facts = index.facts(fixed, args_state)
    for observe in OBSERVERS:
        observe(rules, "global", facts)
    violations = _violations(facts, index)
    opted_in = [v for v in violations if v.kind == "known_failure" and v.rule in allowed]
    violations = [v for v in violations if v not in opted_in]
    if violations:
        raise PlanError(violations, args_state, adjustments, _deviations(rules, given, refusing_rules(violations)))
    adjusted = ServerArgs.model_validate(args_state)

    global_values, global_hits = _resolve_scope(index.global_set, facts, GLOBAL_SPECS, violations)
    scoped = {**facts, **{gate_key(n): v for n, v in global_values.items()}}
    modes = {
        m.value: _resolve_scope(index.mode_set, {**scoped, "forward_mode": m.value}, MODE_SPECS, violations)
        for m in ForwardMode
    }
    layers = {
        k.value: _resolve_scope(index.layer_set, {**scoped, "layer_kind": k.value}, LAYER_SPECS, violations)
        for k in LayerKind
    }
    for observe in OBSERVERS:
        for m in ForwardMode:
            observe(rules, "mode", {**scoped, "forward_mode": m.value})
        for k in LayerKind:
            observe(rules, "layer", {**scoped, "layer_kind": k.value})
    if violations:
        raise PlanError(violations, args_state, adjustments)

    plan = Plan(
        prefill_backend=facts["prefill_backend"],
        decode_backend=facts["decode_backend"],
        **_groups(global_values),
        modes=ModeTable(**{m: ModeGates(**_groups(v)) for m, (v, _) in modes.items()}),
        layers=LayerTable(**{k: LayerGates(**_groups(v)) for k, (v, _) in layers.items()}),
    )

    def explain() -> Explanation:
        return Explanation(
            gates=_explain_scope(global_values, global_hits, index.global_set, facts, GLOBAL_SPECS),
            modes={
                m: _explain_scope(v, h, index.mode_set, {**scoped, "forward_mode": m}, MODE_SPECS)
                for m, (v, h) in modes.items()
            },
            layers={
                k: _explain_scope(v, h, index.layer_set, {**scoped, "layer_kind": k}, LAYER_SPECS)
                for k, (v, h) in layers.items()
            },
            backends=_backend_verdicts(
                server_args.model_dump(), fixed, {facts["prefill_backend"], facts["decode_backend"]}, index
            ),
        )

    return Resolution(
        plan,
        adjusted,
        server_args,
        model,
        platform,
        adjustments,
        functools.cache(explain),
        opted_in,
        _deviations(rules, given, frozenset()),
    )


def _check_allowed(rules: RuleSet, ids: Iterable[str]) -> set[str]:
    known = [r.id for r in rules.rules if r.kind == "known_failure"]
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise PlanError(
            [
                Violation("allow_known_failures", f"{i!r} is not a known_failure rule" + did_you_mean(i, known))
                for i in unknown
            ],
            {},
            [],
        )
    return set(ids)


# ---- rule index ----------------------------------------------------------------------------------

GLOBAL_SPECS = [g for g in GATES.values() if g.scope == "global"]
MODE_SPECS = [g for g in GATES.values() if g.scope == "mode"]
LAYER_SPECS = [g for g in GATES.values() if g.scope == "layer"]


class _Index:
    def __init__(self, rules: RuleSet):
        self.rules = rules
        self.adjust = [r for r in rules.rules if r.adjusts]
        self.checks = [r for r in rules.rules if r.kind == "forbid" or (r.kind == "known_failure" and not r.adjusts)]
        sets = [r for r in rules.rules if r.kind == "set"]
        self.global_set = [r for r in sets if r.scope == "global"]
        self.mode_set = [r for r in sets if r.scope == "mode"]
        self.layer_set = [r for r in sets if r.scope == "layer"]

    def facts(self, fixed: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        """Model/platform facts + server args + derived facts + the rule file's predicates."""
        return self.rules.with_predicates({**fixed, **args, **derived_facts({**fixed, **args})})


def _deviations(rules: RuleSet, given: dict[str, Any], refused_by: frozenset[str]) -> list[Any]:
    applied = applicable_deviations(rules, given, refused_by) if given else []
    for observe in DEVIATION_OBSERVERS:
        observe(rules, applied)
    return applied


@functools.lru_cache(maxsize=8)
def _index(rules: RuleSet) -> _Index:
    return _Index(rules)


# ---- 1. adjust to a fixed point ------------------------------------------------------------------


def _adjust(state: dict[str, Any], fixed: dict[str, Any], index: _Index) -> tuple[dict[str, Any], list[Adjustment]]:
    rounds: list[list[Adjustment]] = []
    seen = {_freeze(state): 0}  # state -> number of rounds after which it held
    while len(rounds) < MAX_ADJUST_ROUNDS:
        facts = index.facts(fixed, state)
        for observe in OBSERVERS:
            observe(index.rules, "adjust", facts)
        wanted: dict[str, dict[Any, list[Rule]]] = {}
        for rule in index.adjust:
            if rule.matches(facts):
                for name, value in rule.adjusts.items():
                    wanted.setdefault(name, {}).setdefault(adjust_value(value, facts), []).append(rule)
        done = [a for r in rounds for a in r]
        conflicts = [
            Violation(
                " vs ".join(r.id for rs in by_value.values() for r in rs),
                f"adjust rules disagree on {name}: "
                + ", ".join(f"{rs[0].id} wants {v!r}" for v, rs in by_value.items()),
                kind="conflict",
            )
            for name, by_value in wanted.items()
            if len(by_value) > 1
        ]
        if conflicts:  # forbid rules that already match usually say why, so report them too
            for observe in OBSERVERS:  # (and rule coverage sees them evaluated)
                observe(index.rules, "global", facts)
            raise PlanError([*_rule_violations(facts, index), *conflicts], state, done)
        round_ = [
            Adjustment(rules[0].id, name, state[name], value, rules[0].message or "", rules[0].issue)
            for name, by_value in wanted.items()
            for value, rules in by_value.items()
            if state[name] != value
        ]
        out_of_type = [
            _out_of_type(rules[0], name, value)
            for name, by_value in wanted.items()
            for value, rules in by_value.items()
            if not FACTS[name].type.accepts(value)
        ]
        if out_of_type:  # a value read from a fact ({from: FACT}) can leave the argument's bounds
            raise PlanError(out_of_type, state, done)
        if not round_:
            return state, done
        state = {**state, **{a.field: a.new for a in round_}}
        rounds.append(round_)
        key = _freeze(state)
        if key in seen:
            cycle = [a for r in rounds[seen[key] :] for a in r]
            names = ", ".join(sorted({a.rule for a in cycle}))
            raise PlanError(
                [
                    Violation(
                        names,
                        "adjust rules never settle; they rewrite in a cycle: " + "; ".join(map(str, cycle)),
                        kind="oscillation",
                    )
                ],
                state,
                done + round_,
            )
        seen[key] = len(rounds)
    raise PlanError(
        [Violation("adjust", f"adjust rules did not settle within {MAX_ADJUST_ROUNDS} rounds", kind="oscillation")],
        state,
        [a for r in rounds for a in r],
    )


def _out_of_type(rule: Rule, name: str, value: Any) -> Violation:
    source = rule.adjusts[name]
    origin = f" (from {source.fact})" if isinstance(source, FactValue) else ""
    return Violation(
        rule.id,
        f"sets {name} to {value!r}{origin}, but {name} is {FACTS[name].type.describe()}",
        kind="adjust",
        issue=rule.issue,
    )


def _freeze(state: dict[str, Any]) -> tuple:
    return tuple(sorted(state.items()))


# ---- 2. forbid / known_failure -------------------------------------------------------------------


def _rule_violations(facts: dict[str, Any], index: _Index) -> list[Violation]:
    return [
        Violation(r.id, r.message or r.summary, kind=r.kind, facts=_read(r, facts), issue=r.issue)
        for r in index.checks
        if r.matches(facts)
    ]


def _violations(facts: dict[str, Any], index: _Index) -> list[Violation]:
    out = _rule_violations(facts, index)
    for side in ("prefill_backend", "decode_backend"):
        if facts[side] is None:
            out.append(
                Violation(
                    "attngate", f"no rule chose a {side.replace('_', ' ')}; pass --attention-backend", kind="forbid"
                )
            )
    return out


def _read(rule: Rule, facts: dict[str, Any]) -> dict[str, Any]:
    return {name: facts.get(gate_key(name) if "." in name else name) for name in rule.condition.reads}


# ---- 3. gates ------------------------------------------------------------------------------------


def _resolve_scope(
    rules: list[Rule], facts: dict[str, Any], specs: list[GateSpec], violations: list[Violation]
) -> tuple[dict[str, Any], dict[str, list[Rule]]]:
    hits: dict[str, list[Rule]] = {}
    for rule in rules:
        if rule.matches(facts):
            for name in rule.sets:
                hits.setdefault(name, []).append(rule)
    values: dict[str, Any] = {}
    for spec in specs:
        matched = hits.get(spec.name)
        if not matched:
            values[spec.name] = facts[spec.from_fact] if spec.from_fact else spec.default
            if not spec.type.accepts(values[spec.name]):
                violations.append(
                    Violation(
                        "attngate",
                        f"gate {spec.name} takes its value from {spec.from_fact}, which is "
                        f"{values[spec.name]!r}; no rule filled it ({spec.type.describe()} needed)",
                    )
                )
            continue
        distinct = {repr(r.sets[spec.name]) for r in matched}
        if len(distinct) > 1:
            where = f" for forward_mode={facts['forward_mode']}" if "forward_mode" in facts else ""
            where += f" for layer_kind={facts['layer_kind']}" if "layer_kind" in facts else ""
            violations.append(
                Violation(
                    " vs ".join(r.id for r in matched),
                    f"set rules disagree on {spec.name}{where}: "
                    + ", ".join(f"{r.id} sets {r.sets[spec.name]!r}" for r in matched),
                    kind="conflict",
                )
            )
        values[spec.name] = matched[0].sets[spec.name]
    return values, hits


def _groups(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        spec = GATES[name]
        groups.setdefault(spec.group, {})[spec.field] = value
    return groups


# ---- explanation ---------------------------------------------------------------------------------


def _explain_scope(
    values: dict[str, Any], hits: dict[str, list[Rule]], rules: list[Rule], facts: dict[str, Any], specs: list[GateSpec]
) -> dict[str, GateExplanation]:
    out = {}
    for spec in specs:
        matched = hits.get(spec.name, [])
        others = [r for r in rules if spec.name in r.sets and r not in matched]
        read: dict[str, Any] = {}
        for rule in matched or others:
            read.update(_read(rule, facts))
        if matched:
            origin = " + ".join(r.id for r in matched)
        else:
            origin = f"fact:{spec.from_fact}" if spec.from_fact else "default"
        out[spec.name] = GateExplanation(
            value=values[spec.name],
            origin=origin,
            rules=[r.id for r in matched],
            facts=read,
            candidates=[Candidate(r.id, r.condition.failed(facts)) for r in others],
        )
    return out


def _backend_verdicts(
    requested: dict[str, Any], fixed: dict[str, Any], chosen: set[str], index: _Index
) -> list[BackendVerdict]:
    """Every candidate backend, asked for alone (``--attention-backend B`` on top of the requested arguments, so the
    adjust rules run as they would for that request), with all the rules that reject it or switch away from it."""
    verdicts = []
    for backend in CANDIDATE_BACKENDS:
        state = {
            **requested,
            "attention_backend": backend,
            "prefill_attention_backend": None,
            "decode_attention_backend": None,
        }
        try:
            state, adjustments = _adjust(state, fixed, index)
        except PlanError as err:
            reasons = [f"{v.rule}: {v.message}" for v in err.violations]
        else:
            trial = index.facts(fixed, state)
            reasons = [f"{r.id}: {r.message or r.summary}" for r in index.checks if r.matches(trial)]
            reasons += [f"{a.rule}: {a.message}" for a in adjustments if a.field in _BACKEND_ARGS]
        status = "chosen" if backend in chosen else ("rejected" if reasons else "accepted")
        verdicts.append(BackendVerdict(backend, status, reasons))
    return verdicts
