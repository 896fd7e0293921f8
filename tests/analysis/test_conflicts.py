"""Lint's conflict search (attngate.analysis.conflicts, issue 53 item 9): exclusivity read off a condition's syntax at
any depth of a conjunction (no solver query per pair of rules that cannot match together), and every conflicting
pair reported where a gate's values conflict with many rules, in solver queries linear in the rules."""

from __future__ import annotations

import ast
import random
from itertools import combinations

import pytest
import yaml
import z3

from attngate.analysis import conflicts as conflicts_module
from attngate.analysis.conflicts import clash_groups, implied_values, literal_key
from attngate.analysis.encoding import Encoder, Finding
from attngate.analysis.lint import lint_rules
from attngate.analysis.verdict import Unknown, Verdict
from attngate.facts.catalogue import FACTS
from attngate.rules.load import parse_rules

TYPES = {n: f.type for n, f in FACTS.items()}


def rule(i: int | str, when: str, sets: dict, **extra) -> str:
    fields = {"id": f"r{i}", "summary": "s", "why": "w", "source": "s", "when": when, "set": sets, **extra}
    return "  - " + yaml.safe_dump(fields, sort_keys=False, width=1000).replace("\n", "\n    ").rstrip() + "\n"


def rules_of(*rules: str, predicates: str = "") -> str:
    return "version: 1\n" + (f"predicates:\n{predicates}" if predicates else "") + "rules:\n" + "".join(rules)


def forced(text: str, predicates: dict[str, str] | None = None) -> dict[str, tuple | set[tuple]]:
    """What a condition confines each fact to: its one literal, or the set of them where more than one."""
    parsed = {n: ast.parse(t, mode="eval").body for n, t in (predicates or {}).items()}
    found = implied_values(ast.parse(text, mode="eval").body, parsed, TYPES)
    return {f: next(iter(v)) if len(v) == 1 else set(v) for f, v in found.items()}


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("page_size == 16", {"page_size": ("num", 16)}),
        (
            'not enable_deterministic_inference and model_type == "m1"',
            {"enable_deterministic_inference": ("bool", False), "model_type": ("str", "m1")},
        ),
        (
            '(use_mla or is_embedding) and (tp_size >= 2 and (model_type in ("llama",) and page_size is None))',
            {"model_type": ("str", "llama"), "page_size": ("none",)},
        ),
        ('"llama" == model_type', {"model_type": ("str", "llama")}),
        (
            'not (enable_deterministic_inference or attention_backend != "fa3")',
            {"enable_deterministic_inference": ("bool", False), "attention_backend": ("str", "fa3")},
        ),
        ('(model_type == "a" and use_mla) or (model_type == "a" and is_embedding)', {"model_type": ("str", "a")}),
        ("page_size == 16.0", {"page_size": ("num", 16)}),  # the encoding compares numbers by value
        ('model_type in ("a", "b")', {"model_type": {("str", "a"), ("str", "b")}}),
        ('(model_type == "a") or (model_type in ("b", "c"))', {"model_type": {("str", c) for c in "abc"}}),
        ('model_type in ("a", "b") and model_type != "b"', {"model_type": {("str", "a"), ("str", "b")}}),  # sound
        ('model_type in ("a", "b") and model_type in ("b", "c")', {"model_type": ("str", "b")}),
        ('model_type in ("a", "b") and not model_type not in ("c",)', {"model_type": set()}),  # never holds
        ("not (page_size != 16 and page_size != 32)", {"page_size": {("num", 16), ("num", 32)}}),
        ("use_mla or not use_mla", {"use_mla": {("bool", True), ("bool", False)}}),  # never None
    ],
)
def test_a_condition_forces_the_literals_of_its_conjuncts_at_any_depth(condition, expected):
    assert forced(condition) == expected


@pytest.mark.parametrize(
    ("condition", "fact"),
    [
        ('(model_type == "a") or use_mla', "model_type"),
        ('model_type in ("a", None)', "model_type"),
        ("page_size != 16", "page_size"),
        ("not (page_size == 16)", "page_size"),
        ("not (page_size == 16 and use_mla)", "page_size"),
        ("not use_mla or page_size == 16", "page_size"),
        ("page_size >= 16 and page_size <= 16", "page_size"),  # forced, but not by a literal: the solver's to find
        ("page_size == tp_size", "page_size"),
        ("page_size is not None", "page_size"),
    ],
)
def test_what_does_not_force_one_literal_is_left_to_the_solver(condition, fact):
    assert fact not in forced(condition)


def test_predicates_are_read_through_and_negated_bools_force_only_where_none_is_impossible():
    assert forced("keyed and use_mla", {"keyed": 'model_type == "m" and page_size == 1'}) == {
        "model_type": ("str", "m"),
        "page_size": ("num", 1),
        "use_mla": ("bool", True),
    }
    assert forced("not unkeyed", {"unkeyed": "page_size != 1"}) == {"page_size": ("num", 1)}
    optional_bools = [n for n, t in TYPES.items() if t.base == "bool" and t.optional]
    for name in optional_bools[:1]:  # `not x` holds where x is None as well as False
        assert forced(f"not {name}") == {} and forced(name) == {name: ("bool", True)}
    assert literal_key(1) == literal_key(1.0) != literal_key(True)


def listed(message: str) -> set[tuple[str, ...]]:
    """The pairs a finding of many pairs lists ("N pairs of set rules ... on gate G: a / b; c / d; e.g. ...")."""
    pairs = message.split(": ", 1)[1].split("; e.g. ")[0].split("; ")
    return {tuple(p.split(" / ")) for p in pairs}


def _family(n: int, gate: str = "fa.num_splits") -> list[str]:
    """``n`` rules giving one gate ``n`` values under mutually exclusive model types inside a conjunction, half of
    them behind ``backends:`` (one more level of conjunction)."""
    return [
        rule(i, f'not enable_deterministic_inference and model_type == "m{i}"', {gate: i + 1})
        if i % 2
        else rule(
            i, f'page_size is not None and (model_type in ("m{i}",) and not use_mla)', {gate: i + 1}, backends=["fa3"]
        )
        for i in range(n)
    ]


def _counting(monkeypatch) -> list[int]:
    """Counts the solver checks of the conflict search."""
    calls = [0]
    real = conflicts_module.check

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(conflicts_module, "check", counted)
    return calls


def test_a_conjunction_shaped_exclusive_family_is_split_without_any_solver_query(monkeypatch):
    rules = parse_rules(rules_of(*_family(40)), "family.yaml")
    predicates = {p.name: p.condition.tree.body for p in rules.predicates}
    classes = {repr(r.sets["fa.num_splits"]): [r] for r in rules.rules}
    assert list(clash_groups(classes, lambda r: implied_values(r.condition.tree.body, predicates, TYPES))) == []

    calls = _counting(monkeypatch)
    assert lint_rules(rules) == []
    assert calls[0] == 0  # no pair of the 40 rules (780 pairs) went to the solver


def test_a_family_confined_to_disjoint_sets_of_values_is_split_without_any_solver_query(monkeypatch):
    """`model_type in ("mI", "nI")`, or a disjunction of equalities: 400 such rules took lint 286 s, each pair put to
    z3's string theory together."""
    family = [
        rule(i, f'not enable_deterministic_inference and model_type in ("m{i}", "n{i}")', {"fa.num_splits": i + 1})
        if i % 2
        else rule(
            i, f'page_size is not None and (model_type == "m{i}" or model_type == "n{i}")', {"fa.num_splits": i + 1}
        )
        for i in range(40)
    ]
    rules = parse_rules(rules_of(*family), "sets.yaml")
    calls = _counting(monkeypatch)
    assert lint_rules(rules) == []
    assert calls[0] == 0  # no pair of the 40 rules went to the solver
    shared = rule("both", 'model_type in ("m3", "n8")', {"fa.num_splits": 99})  # meets r3 and r8: both reported
    (finding,) = lint_rules(parse_rules(rules_of(*family, shared), "sets.yaml"))
    assert listed(finding.message) == {("r3", "rboth"), ("r8", "rboth")}


def test_every_pair_is_reported_where_one_rule_conflicts_with_each_of_many(monkeypatch):
    n = 40
    family = [rule(i, f"page_size == {16 + i}", {"fa.num_splits": i + 2}) for i in range(n)]  # exclusive: page sizes
    text = rules_of(rule("base", "use_mla", {"fa.num_splits": 1}), *family)
    calls = _counting(monkeypatch)
    results = lint_rules(parse_rules(text, "many.yaml"))
    (finding,) = [f for f in results if "disagree on gate fa.num_splits" in f.message]
    assert isinstance(finding, Finding) and finding.message.startswith(f"{n} pairs of set rules")
    assert listed(finding.message) == {("rbase", f"r{i}") for i in range(n)}
    assert calls[0] <= 2 * n + 8, calls[0]  # one query per rule (plus a few), not one per pair of the 41 rules


def test_a_pair_disagreeing_on_two_gates_is_reported_once_and_no_pair_of_the_second_gate_is_lost():
    both = [
        rule(i, f"tp_size >= {i + 1}", {"fa.num_splits": i + 1, "flashinfer.workspace_size_mb": i + 1})
        for i in range(4)
    ]
    text = rules_of(*both, rule("y", "tp_size >= 1", {"flashinfer.workspace_size_mb": 999}))
    messages = [f.message for f in lint_rules(parse_rules(text, "two.yaml"))]
    two = [m for m in messages if "fa.num_splits, flashinfer.workspace_size_mb" in m]
    one = [m for m in messages if "disagree on gate flashinfer.workspace_size_mb:" in m]
    assert len(two) == 1 and listed(two[0]) == {(f"r{i}", f"r{j}") for i in range(4) for j in range(i + 1, 4)}
    assert len(one) == 1 and listed(one[0]) == {(f"r{i}", "ry") for i in range(4)}, messages


def test_a_rule_by_rule_query_z3_cannot_decide_is_reported_never_read_as_no_conflict(monkeypatch):
    n = 12
    family = [rule(i, f"page_size == {16 + i}", {"fa.num_splits": i + 2}) for i in range(n)]
    rules = parse_rules(rules_of(rule("base", "use_mla", {"fa.num_splits": 1}), *family), "undecided.yaml")
    real = conflicts_module._Linked.find

    def undecided_one_by_one(self, claim, *, filtered=True, **kwargs):
        return (Verdict("unknown", "timeout"), None) if not filtered else real(self, claim, filtered=filtered, **kwargs)

    monkeypatch.setattr(conflicts_module._Linked, "find", undecided_one_by_one)
    results = lint_rules(rules)
    unknown = [u for u in results if isinstance(u, Unknown)]
    found = [f for f in results if isinstance(f, Finding) and "fa.num_splits" in f.message]
    pairs = int(found[0].message.split()[0]) if found and found[0].message[0].isdigit() else len(found)
    assert pairs + len(unknown) >= n, results  # each pair either found or covered by an unknown naming its rule
    assert all("disagree on gate fa.num_splits" in u.query and "timeout" in u.message for u in unknown)
    assert unknown and not [r for r in results if "can never" in r.message]


def test_a_pair_that_only_matches_beside_other_conflicting_pairs_is_reported():
    """Blocking each model's pairs (lint's enumeration before) loses r0 / r1: wherever both match, r2 or r3 does too
    (attention_backend is fa3 or it is not), and those pairs were blocked first."""
    text = rules_of(
        rule(0, 'model_type == "m1"', {"fa.num_splits": 3}),
        rule(1, "page_size == 64", {"fa.num_splits": 4}),
        rule(2, 'attention_backend != "fa3"', {"fa.num_splits": 2}),
        rule(3, 'attention_backend == "fa3"', {"fa.num_splits": 2}),
    )
    (finding,) = lint_rules(parse_rules(text, "beside.yaml"))
    assert listed(finding.message) == {("r0", "r1"), ("r0", "r2"), ("r0", "r3"), ("r1", "r2"), ("r1", "r3")}


_ATOMS = (
    "page_size == {p}",
    "page_size in ({p},)",
    'model_type == "m{m}"',
    "use_mla",
    "not use_mla",
    "tp_size >= {t}",
    "not enable_deterministic_inference",
    'attention_backend != "fa3"',
    "page_size is None",
    "keyed",
    "not keyed",
    'model_type in ("m{m}", "m2")',
    "page_size in ({p}, 64)",
    "page_size not in ({p},)",
    "not (page_size != {p} and page_size != 16)",
)


def _condition(r: random.Random, depth: int = 0) -> str:
    if depth > 2 or r.random() < 0.3:
        return r.choice(_ATOMS).format(p=r.choice([16, 32, 64]), m=r.randint(0, 2), t=r.randint(1, 4))
    if r.random() < 0.7:
        return "(" + " and ".join(_condition(r, depth + 1) for _ in range(r.randint(2, 3))) + ")"
    return (
        "not " + _condition(r, depth + 1)
        if r.random() < 0.3
        else f"({_condition(r, depth + 1)} or {_condition(r, depth + 1)})"
    )


@pytest.mark.parametrize("seed", range(16))
def test_lint_reports_exactly_the_pairs_a_pairwise_search_finds(seed):
    """Random rule files (nested conjunctions, predicates, backends:, two gates) against every pair put to z3."""
    r = random.Random(seed)
    rules = [
        rule(
            i,
            _condition(r),
            {"fa.num_splits": r.randint(1, 4), **({"flashinfer.workspace_size_mb": 1 + i % 2} if i % 3 == 0 else {})},
            **({"backends": ["fa3"]} if r.random() < 0.3 else {}),
        )
        for i in range(r.randint(4, 8))
    ]
    rules_set = parse_rules(rules_of(*rules, predicates='  keyed: page_size == 32 and model_type == "m1"\n'), "r.yaml")
    enc = Encoder(rules_set, all_gates=True)
    cond = {x.id: enc.encode(x.condition.tree.body) for x in rules_set.rules}
    solver = z3.Solver()
    solver.add(*enc.axioms, *enc.links)
    expected = set()
    for a, b in combinations(rules_set.rules, 2):
        names = ", ".join(n for n in a.sets if n in b.sets and a.sets[n] != b.sets[n])
        if names and solver.check(cond[a.id], cond[b.id]) == z3.sat:
            expected.add((names, a.id, b.id))
    found = set()
    for f in lint_rules(rules_set):
        if " pairs of set rules" in f.message:
            names = f.message.split("disagree on gate ")[1].split(": ")[0]
            found |= {(names, *pair) for pair in listed(f.message)}
        elif "can both match and disagree" in f.message:
            a, b = f.message.split("'")[1], f.message.split("'")[3]
            found.add((f.message.split("disagree on gate ")[1].split("; e.g.")[0], a, b))
    assert found == expected


def test_lint_reads_each_predicate_once_not_the_whole_file_per_predicate(monkeypatch):
    """What a predicate or rule reads is looked up in one index (prove.ReadIndex) for the whole file: built per
    predicate, 20,000 predicates took lint 67 s (quadratic), 18 s with one index."""
    from attngate.analysis import prove

    built = [0]
    real = prove.ReadIndex.of.__func__

    def counted(cls, *args, **kwargs):
        built[0] += 1
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(prove.ReadIndex, "of", classmethod(counted))
    predicates = "".join(f"  p{i}: tp_size == {i + 1} or page_size == {i + 1}\n" for i in range(300))
    rules = [rule(i, f"p{i} and use_mla", {"fa.num_splits": 1}) for i in range(0, 300, 30)]
    assert lint_rules(parse_rules(rules_of(*rules, predicates=predicates), "many.yaml")) == []
    assert built[0] <= 3, built[0]
