"""The docs' generated gate reference (docs/generate.py): a page per gate of the registry with its type, default and
scope, the rules that set it, the code that reads it (found in the source), its invariants and its tests."""

from __future__ import annotations

import importlib.util

from attngate.plan.registry import GATES
from tests.support.helpers import ROOT


def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_gate_has_a_page_with_its_rules_code_invariants_and_tests(tmp_path):
    gen = _generator()
    fired_in = {"fa.no-precompute-under-dp-attention": ["tests/x.py::test_dp"]}
    names = gen.gate_pages(tmp_path, fired_in)
    assert sorted(names) == sorted(GATES)
    for name in GATES:
        page = (tmp_path / f"{name}.md").read_text()
        for section in ("| type | default | scope |", "## Rules that set it", "## Code that reads it", "## Invariants"):
            assert section in page, (name, section)
        assert "## Tests that assert on it" in page
    dp = (tmp_path / "fa.precompute_scheduler_metadata.md").read_text()
    assert "`fa.no-precompute-under-dp-attention` (set)" in dp and "tests/x.py::test_dp" in dp
    assert "attngate/backends/" in dp  # the FA backend reads it: found in the source, file:line
    assert "`no-scheduler-precompute-under-dp-attention-or-prefill-cp`" in dp  # the invariant that guards it
    index = (tmp_path / "index.md").read_text()
    assert all(f"[`{name}`]({name}.md)" in index for name in GATES)


def test_code_reads_are_real_lines_of_the_named_files():
    """Each place reads the gate's field there, or calls the Plan method that reads it (``(Plan.backend_for)``)."""
    reads = _generator().code_reads()
    for name, places in reads.items():
        for place in places:
            where, _, via = place.partition(" (Plan.")
            path, line = where.rsplit(":", 1)
            source = (ROOT / path).read_text().splitlines()[int(line) - 1]
            assert (via.rstrip(")") + "(" if via else GATES[name].field) in source, (name, place, source)
    assert any(p.endswith("(Plan.backend_for)") for p in reads["common.runs_on"])  # read only through the Plan


def test_a_gates_tests_are_those_that_assert_on_it():
    """The gate pages list the tests with an assert naming the gate (not every test where one of its rules fired):
    each is a real test function of the named file, and every gate has one (a gate no test would notice changing is
    a gate no test holds to its rules)."""
    import ast

    asserted = _generator().asserting_tests()
    assert [gate for gate, tests in asserted.items() if not tests] == []
    # a check passed to a parametrized test counts: test_rule_outcomes' lambdas assert on common.cuda_graph
    assert "tests/engine/shipped/test_outcomes.py::test_rule_outcomes" in asserted["common.cuda_graph"]
    assert (
        "tests/engine/shipped/test_forward_modes.py::test_each_mode_runs_on_the_backend_sglangs_hybrid_backend_picks"
        in (asserted["common.runs_on"])
    )
    assert 0 < len(asserted["common.causal"]) < 100
    functions: dict[str, set[str]] = {}
    for tests in asserted.values():
        for test in tests:
            path, _, name = test.partition("::")
            if path not in functions:
                tree = ast.parse((ROOT / path).read_text())
                functions[path] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in functions[path], test


def test_the_rule_language_page_lists_every_derived_fact():
    """docs/rule-language.md names the derived facts a condition may read: exactly the catalogue's."""
    import re

    from attngate.facts.catalogue import FACTS

    text = (ROOT / "docs" / "rule-language.md").read_text()
    listed = text[text.index("; derived\n") : text.index("(each declared once in")]
    derived = {name for name, spec in FACTS.items() if spec.origin == "derived"}
    assert set(re.findall(r"`(\w+)`", listed)) == derived


def test_the_plan_page_gate_table_is_the_generated_one():
    """docs/plan.md's gate table is generated from the Plan schema (docs/generate.py plan_page): the committed page is
    what the generator makes of it, a row per gate of the registry, so it cannot fall behind the schema."""
    gen = _generator()
    committed = (ROOT / "docs" / "plan.md").read_text()
    assert committed == gen.plan_page(committed), "docs/plan.md is stale: run python docs/generate.py"
    assert all(f"[`{name}`](reference/gates/{name}.md)" in committed for name in GATES)


def test_every_catalogue_number_a_rule_cites_is_in_the_repositorys_catalogue():
    """Rule and deviation sources cite SGLang's gates by catalogue number (G*, F*: a section; R*: a row of its
    tables), in docs/sglang-attention-gates.md: each one cited is there."""
    import re

    catalogue = (ROOT / "docs" / "sglang-attention-gates.md").read_text()
    entries = set(re.findall(r"^### ([A-Z]\d+[a-z]?) ", catalogue, flags=re.M))
    entries |= set(re.findall(r"^\| ([A-Z]\d+[a-z]?) \|", catalogue, flags=re.M))
    cited = set(re.findall(r"\(([GFR]\d+[a-z]?)\)", (ROOT / "rules.yaml").read_text()))
    assert cited and not cited - entries, sorted(cited - entries)
