"""``resolve()``: server args + model facts + platform + rules -> a frozen, explained Plan.

Semantics (DESIGN.md, "Resolution semantics"), one stage per step of :func:`resolve`:

1. adjust (:mod:`attngate.engine.adjust`): ``adjust`` rules (and ``known_failure`` rules with a ``fallback``) run
   to a fixed point, every round on one state, so the order of rules in the file cannot change the result.
2. refusals: ``forbid`` and ``known_failure`` rules are checked on the adjusted arguments; every violation is
   collected into one :class:`PlanError`.
3. gates (:mod:`attngate.engine.scopes`): each gate takes the value its matching ``set`` rules give it (two
   different values: a conflict), else its default; global gates first, then the per-mode and per-layer tables,
   whose rules may read the resolved global gates.
4. build: the frozen Plan, and a Resolution whose explanation (:mod:`attngate.engine.explain`) is built on first use.

Where the backend the default chain chose is refused, :mod:`attngate.engine.fallback` resolves with the first
candidate that runs; a refusal where the backend is at issue lists every candidate.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Collection, Iterable

from attngate.engine.adjust import adjust, violations
from attngate.engine.explain import backend_verdicts, explain_scope
from attngate.engine.fallback import fall_back
from attngate.engine.index import (
    DEVIATION_OBSERVERS,
    GLOBAL_SPECS,
    LAYER_SPECS,
    MODE_SPECS,
    RuleIndex,
    index_of,
    observe,
)
from attngate.engine.result import Explanation, Resolution, Violation
from attngate.engine.scopes import grouped, resolve_scope
from attngate.errors import PlanError, check_arguments, quoted
from attngate.facts.catalogue import base_facts
from attngate.facts.model import ModelFacts
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.plan.schema import LayerGates, LayerTable, ModeGates, ModeTable, Plan
from attngate.rules.condition import gate_key
from attngate.rules.deviations import applicable_deviations, refusing_rules
from attngate.rules.load import load_rules
from attngate.rules.ruleset import RuleSet
from attngate.types import ViolationKind
from attngate.util.suggest import suggestion


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
    allowed = _check_allowed(rules, allow_known_failures)
    once = functools.partial(_resolve_once, model=model, platform=platform, rules=rules, allowed=allowed)
    try:
        return once(server_args)
    except PlanError as err:
        if not err.adjustments and err.server_args == {}:  # an argument of the call at fault: no backend helps
            raise
        return fall_back(server_args, err, once)


def _resolve_once(
    server_args: ServerArgs, *, model: ModelFacts, platform: Platform, rules: RuleSet, allowed: set[str]
) -> Resolution:
    """The four stages for one set of arguments (the module doc); no fallback."""
    index = index_of(rules)
    fixed = base_facts(server_args, model, platform)
    deviations = _Deviations(rules, rules.with_predicates(fixed) if rules.deviations else {})

    # 1. adjust
    try:
        args_state, adjustments = adjust(server_args.model_dump(), fixed, index)
    except PlanError as err:  # adjust rules in conflict, or a value out of its type: SGLang may still accept it
        err.deviations = deviations.refused(err.violations)
        raise
    facts = index.facts(fixed, args_state)
    observe(rules, "global", facts)

    # 2. refusals
    found = violations(facts, index)
    opted_in = [v for v in found if v.kind == ViolationKind.KNOWN_FAILURE and v.rule in allowed]
    found = [v for v in found if v not in opted_in]
    if found:
        raise PlanError(found, args_state, adjustments, deviations.refused(found))
    adjusted = ServerArgs.model_validate(args_state)

    # 3. gates: global, then per forward mode and per layer kind
    tables = _GateTables.resolve(index, facts)
    if tables.violations:
        raise PlanError(tables.violations, args_state, adjustments)

    # 4. build
    explain = functools.cache(lambda: tables.explain(index, facts, server_args.model_dump(), fixed))
    return Resolution(
        plan=tables.plan(facts),
        server_args=adjusted,
        requested_args=server_args,
        model=model,
        platform=platform,
        adjustments=adjustments,
        _explain=explain,
        allowed_known_failures=opted_in,
        deviations=deviations.accepted(),
    )


def _check_allowed(rules: RuleSet, ids: Iterable[str]) -> set[str]:
    known = [r.id for r in rules.rules if r.kind == "known_failure"]
    problems = [
        Violation.of_argument(
            "allow_known_failures",
            f"{quoted(i)} is not a known_failure rule",
            help=suggestion(i, known),
        )
        for i in ids
        if not isinstance(i, str) or i not in known
    ]
    if problems:
        raise PlanError(problems, {}, [])
    return set(ids)


@dataclass(frozen=True)
class _Deviations:
    """The rules file's ``deviations:`` that apply to the given arguments (``given``: the facts before any
    adjustment, empty when the file declares none), reported to the deviation observers."""

    rules: RuleSet
    given: dict[str, Any]

    def refused(self, found: list[Violation]) -> list[Any]:
        return self._applied(refusing_rules(found))

    def accepted(self) -> list[Any]:
        return self._applied(frozenset())

    def _applied(self, refused_by: frozenset[str]) -> list[Any]:
        applied = applicable_deviations(self.rules, self.given, refused_by) if self.given else []
        for observer in DEVIATION_OBSERVERS:
            observer(self.rules, applied)
        return applied


@dataclass(frozen=True)
class _GateTables:
    """Stage 3's result: the global gates, and per forward mode and per layer kind their tables, each with the
    rules that set each gate."""

    global_: tuple[dict[str, Any], dict[str, list]]
    modes: dict[str, tuple[dict[str, Any], dict[str, list]]]
    layers: dict[str, tuple[dict[str, Any], dict[str, list]]]
    scoped: dict[str, Any]  # the facts with the global gates, read by the mode and layer rules
    violations: list[Violation]

    @classmethod
    def resolve(cls, index: RuleIndex, facts: dict[str, Any]) -> _GateTables:
        found: list[Violation] = []
        global_ = resolve_scope(index.global_set, facts, GLOBAL_SPECS, found)
        scoped = {**facts, **{gate_key(n): v for n, v in global_[0].items()}}
        modes = {
            m.value: resolve_scope(index.mode_set, {**scoped, "forward_mode": m.value}, MODE_SPECS, found)
            for m in ForwardMode
        }
        layers = {
            k.value: resolve_scope(index.layer_set, {**scoped, "layer_kind": k.value}, LAYER_SPECS, found)
            for k in LayerKind
        }
        for m in ForwardMode:
            observe(index.rules, "mode", {**scoped, "forward_mode": m.value})
        for k in LayerKind:
            observe(index.rules, "layer", {**scoped, "layer_kind": k.value})
        return cls(global_, modes, layers, scoped, found)

    def plan(self, facts: dict[str, Any]) -> Plan:
        return Plan(
            prefill_backend=facts["prefill_backend"],
            decode_backend=facts["decode_backend"],
            **grouped(self.global_[0]),
            modes=ModeTable(**{m: ModeGates(**grouped(v)) for m, (v, _) in self.modes.items()}),
            layers=LayerTable(**{k: LayerGates(**grouped(v)) for k, (v, _) in self.layers.items()}),
        )

    def explain(
        self, index: RuleIndex, facts: dict[str, Any], requested: dict[str, Any], fixed: dict[str, Any]
    ) -> Explanation:
        values, hits = self.global_
        return Explanation(
            gates=explain_scope(values, hits, index.global_set, facts, GLOBAL_SPECS),
            modes={
                m: explain_scope(v, h, index.mode_set, {**self.scoped, "forward_mode": m}, MODE_SPECS)
                for m, (v, h) in self.modes.items()
            },
            layers={
                k: explain_scope(v, h, index.layer_set, {**self.scoped, "layer_kind": k}, LAYER_SPECS)
                for k, (v, h) in self.layers.items()
            },
            backends=backend_verdicts(requested, fixed, {facts["prefill_backend"], facts["decode_backend"]}, index),
        )
