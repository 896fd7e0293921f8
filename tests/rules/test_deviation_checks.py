"""Deviations checked like rules (issue 53): loading refuses a deviation that could hide what it does not name (no
field, a value deviation that holds everywhere by ``when: true``, a refusal deviation naming a rule that never
refuses), lint refuses one whose condition is a tautology (an undecided query is reported unknown, never proved), and
every shipped deviation is exercised by a conformance case (attngate's side of the generated corpus and
tests/integrations/sglang/deviation_cases.json, no SGLang needed)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import z3

from attngate import Platform, RulesError, ServerArgs, resolve
from attngate.analysis.deviation_lint import lint_tautologies
from attngate.analysis.encoding import Encoder, Finding
from attngate.analysis.lint import lint_rules
from attngate.analysis.verdict import Unknown
from attngate.errors import PlanError
from attngate.facts.model import ModelFacts
from attngate.integrations.sglang.cases import Case, generate_cases, load_cases
from attngate.rules.deviations import DeviationCoverage, given_facts, refusing_rules
from attngate.rules.load import load_rules, parse_rules
from tests.support.helpers import MODELS, ROOT, refusing_rules_of

RULES = """version: 1
rules:
  - {id: fb, kind: forbid, summary: s, why: w, source: s, when: use_mla and is_embedding, message: m}
  - {id: kf, kind: known_failure, summary: s, why: w, source: s, when: is_embedding and use_mla, message: m, issue: i}
  - id: kf-fallback
    kind: known_failure
    summary: s
    why: w
    source: s
    when: is_embedding and not use_mla
    message: m
    issue: i
    fallback: {disable_radix_cache: true}
  - {id: adj, kind: adjust, summary: s, why: w, source: s, when: is_multimodal, adjust: {page_size: 16}, message: m}
  - {id: st, summary: s, why: w, source: s, when: use_mla, set: {fa.num_splits: 1}}
deviations:
"""
DEVIATION_CASES = ROOT / "tests" / "integrations" / "sglang" / "deviation_cases.json"
GPUS = ["sm80", "sm90", "sm100"]


def _load(deviations: str):
    return parse_rules(RULES + deviations, "r.yaml")


def _at(entry: str, token: str) -> str:
    """The ``r.yaml:LINE:COL`` of ``token`` in the one-line deviation ``entry`` (line 17, after RULES)."""
    return f"r.yaml:17:{entry.index(token) + 1}"


def _problems(deviations: str) -> list[str]:
    with pytest.raises(RulesError) as err:
        _load(deviations)
    return [str(p) for p in err.value.problems]


# ---- loading ---------------------------------------------------------------------------------------------------


def test_a_deviation_of_no_field_is_refused_at_its_place():
    entry = "  - {id: d, fields: [], when: use_mla, reason: r, source: s}\n"
    problems = _problems(entry)
    assert len(problems) == 1 and problems[0].startswith(f"{_at(entry, '[]')}: fields:")
    assert "declares at least one field" in problems[0]


def test_a_field_listed_twice_is_refused():
    entry = "  - {id: d, fields: [page_size, page_size], when: use_mla, reason: r, source: s}\n"
    assert _problems(entry) == [f"{_at(entry, '[')}: fields: page_size listed more than once"]


@pytest.mark.parametrize(
    ("fields", "when", "place"),
    [
        ("[attention_backend, page_size, refusal, sglang_refusal]", "when: true, ", "true"),  # issue 53's
        ("page_size", "", "d,"),  # when is true by default: reported at the id
        ("sglang_refusal", "when: true, ", "true"),
    ],
)
def test_a_value_deviation_that_holds_everywhere_is_refused(fields: str, when: str, place: str):
    rules = ", rules: [fb]" if "refusal," in fields else ""
    entry = f"  - {{id: d, fields: {fields}{rules}, {when}reason: r, source: s}}\n"
    problems = _problems(entry)
    assert len(problems) == 1 and problems[0].startswith(f"{_at(entry, place)}: deviation 'd': declares "), problems
    assert "would excuse every such difference of every configuration" in problems[0]


def test_a_refusal_deviation_may_hold_everywhere_its_rules_bound_it():
    rules = _load("  - {id: d, fields: refusal, rules: [fb, kf], reason: r, source: s}\n")
    assert [d.rules for d in rules.deviations] == [("fb", "kf")]


@pytest.mark.parametrize(
    ("rule", "kind"),
    [("st", "set"), ("adj", "adjust"), ("kf-fallback", "known_failure with a fallback")],
)
def test_a_refusal_deviation_naming_a_rule_that_never_refuses_is_refused(rule: str, kind: str):
    entry = f"  - {{id: d, fields: refusal, rules: [fb, {rule}], reason: r, source: s}}\n"
    assert _problems(entry) == [
        f"{_at(entry, rule + ']')}: deviation 'd': rule {rule!r} is of kind {kind}, which never refuses a configuration; "
        "fields: refusal names forbid and known_failure rules (without a fallback)"
    ]


@pytest.mark.parametrize("fallback", ["null", "{}"])
def test_a_known_failure_whose_fallback_is_empty_refuses_and_a_refusal_deviation_may_name_it(fallback: str):
    """The engine reads ``fallback: null`` or ``{}`` as none: the rule refuses, so a refusal deviation may name it."""
    text = RULES.replace("    fallback: {disable_radix_cache: true}\n", f"    fallback: {fallback}\n")
    rules = parse_rules(text + "  - {id: d, fields: refusal, rules: [kf-fallback], reason: r, source: s}\n", "r.yaml")
    assert [d.rules for d in rules.deviations] == [("kf-fallback",)]
    embedding = ModelFacts.from_hf_config(MODELS / "Qwen3-Embedding-8B.json")
    args = ServerArgs.from_flags(["--is-embedding"])
    assert "kf-fallback" in refusing_rules_of(lambda: resolve(args, embedding, Platform.from_name("sm90"), rules=rules))


def test_a_rule_listed_twice_is_refused():
    entry = "  - {id: d, fields: refusal, rules: [fb, kf, fb], reason: r, source: s}\n"
    assert _problems(entry) == [f"{_at(entry, '[fb')}: rules: fb listed more than once"]


def test_a_refusal_deviation_naming_no_rule_of_the_file_is_refused():
    entry = "  - {id: d, fields: refusal, rules: [fbb], reason: r, source: s}\n"
    assert _problems(entry) == [f"{_at(entry, 'd,')}: deviation 'd': no rule 'fbb'\n    help: did you mean 'fb'?"]


# ---- lint ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "when",
    ["True", "page_size is None or page_size >= 1", "use_mla or not use_mla", "is_embedding or not is_embedding"],
)
def test_lint_refuses_a_value_deviation_whose_condition_is_a_tautology(when: str):
    entry = f"  - {{id: d, fields: [attention_backend, page_size], when: '{when}', reason: r, source: s}}\n"
    found = [f for f in lint_rules(_load(entry)) if "every configuration" in f.message]
    assert len(found) == 1 and isinstance(found[0], Finding) and found[0].where == _at(entry, "d,")
    assert "deviation 'd' holds for every configuration: it would excuse every difference of attention_backend, " in (
        found[0].message
    )


def test_lint_passes_a_deviation_that_some_configuration_escapes():
    rules = _load(
        "  - {id: d, fields: [page_size], when: 'page_size is None or page_size > 1', reason: r, source: s}\n"
    )
    assert [f for f in lint_rules(rules) if "every configuration" in f.message] == []


def test_an_undecided_tautology_query_is_unknown_never_proved(monkeypatch):
    entry = "  - {id: d, fields: [page_size], when: use_mla or not use_mla, reason: r, source: s}\n"
    rules = _load(entry)
    enc = Encoder(rules)
    solver = z3.Solver()
    solver.add(*enc.axioms)
    monkeypatch.setattr(z3.Solver, "check", lambda self, *assumptions: z3.unknown)
    monkeypatch.setattr(z3.Solver, "reason_unknown", lambda self: "timeout")
    found = lint_tautologies(rules, enc, solver)
    assert found == [Unknown(_at(entry, "d,"), "does deviation 'd' hold for every configuration", "timeout")]


def test_no_shipped_deviation_is_a_tautology():
    rules = load_rules()
    enc = Encoder(rules)
    solver = z3.Solver()
    solver.add(*enc.axioms)
    assert lint_tautologies(rules, enc, solver) == []


# ---- coverage over the conformance corpus -----------------------------------------------------------------------


def _flags(case: Case) -> list[str]:
    """The case's SGLang arguments as a launch line (every value a non-default one; a bool is a switch)."""
    flags = []
    for name, value in case.args.items():
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(case.model_config) if value == "{model}" else str(value)]
    return flags


def _record(coverage: DeviationCoverage, case: Case, model: ModelFacts) -> None:
    """attngate's side of conform for one case (attngate.integrations.sglang.compare.compare_case): the rules it was
    refused through (a refused default backend included), and the deviations that then apply."""
    args = ServerArgs.from_flags(_flags(case))
    platform = Platform.from_name(case.gpu, kernels=case.kernels)
    refused: frozenset[str] = frozenset()
    try:
        resolution = resolve(args, model, platform, coverage.rules)
        if resolution.default_refusal is not None:
            refused = refusing_rules(list(resolution.default_refusal[1]))
    except PlanError as err:
        refused = refusing_rules(err.violations)
    coverage.record(case.name, given_facts(coverage.rules, args, model, platform), refused)


def _deviation_cases() -> list[Case]:
    """The cases for deviations the generated corpus cannot reach (more than two settings); each is named
    ``deviation/<id>/...`` after the deviation it exercises. Their argument names are SGLang's, checked against
    SGLang's ServerArgs in tests/integrations/sglang/test_deviation_cases.py."""
    names = frozenset(k for c in json.loads(DEVIATION_CASES.read_text()) for k in c["args"])
    return load_cases(DEVIATION_CASES, names)


def _coverage(rules, cases: list[Case]) -> DeviationCoverage:
    coverage = DeviationCoverage(rules)
    models: dict[Path, ModelFacts] = {}
    for case in cases:
        model = models.get(case.model_config) or models.setdefault(
            case.model_config, ModelFacts.from_hf_config(case.model_config)
        )
        _record(coverage, case, model)
    return coverage


def test_every_shipped_deviation_is_exercised_by_a_conformance_case():
    rules = load_rules()
    extra = _deviation_cases()
    coverage = _coverage(rules, generate_cases(sorted(MODELS.glob("*.json")), GPUS, rules) + extra)
    report = coverage.report()
    assert report["never_applied"] == [], "deviations no conformance case makes applicable:\n" + "\n".join(
        f"  {d['where']}: {d['deviation']}" for d in report["never_applied"]
    )
    assert len(report["exercised"]) == len(rules.deviations)
    for case in extra:  # each extra case exercises the deviation it is named after
        assert case.name in coverage.cases.get(case.name.split("/")[1], []), case.name
    if report["rules_never_refusing"]:  # reported, not failed
        listed = "; ".join(f"{d}: {', '.join(rs)}" for d, rs in report["rules_never_refusing"].items())
        warnings.warn(f"refusal deviations naming rules no corpus case refuses through: {listed}", stacklevel=1)


def test_a_deviation_no_case_reaches_is_listed():
    text = (ROOT / "rules.yaml").read_text()
    extra = '  - id: test.only-on-sm121\n    fields: [page_size]\n    when: gpu_arch == "sm121"\n    reason: r\n    source: s\n'
    rules = parse_rules(text.replace("\ndeviations:\n", "\ndeviations:\n" + extra, 1), "rules.yaml")
    cases = generate_cases(sorted(MODELS.glob("*.json"))[:2], ["sm90"], rules)[:40]
    report = _coverage(rules, cases).report()
    assert "test.only-on-sm121" in [d["deviation"] for d in report["never_applied"]]
    assert "test.only-on-sm121" not in report["exercised"]
