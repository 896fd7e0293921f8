"""The rule-coverage pytest plugin (``--rule-coverage``), run on a small inner test session."""

from __future__ import annotations

import json

pytest_plugins = ["pytester"]

INNER = """
from attngate import ModelFacts, Platform, ServerArgs, resolve
from helpers_path import LLAMA

def test_one_resolve():
    platform = Platform.from_name("sm90", kernels=["attngate"])  # fa3 served by flash_attn.cute
    resolve(ServerArgs(attention_backend="fa3"), ModelFacts.from_hf_config(LLAMA), platform)
"""


def _inner(pytester, *args):
    from tests.support.helpers import MODELS

    pytester.makepyfile(helpers_path=f"LLAMA = {str(MODELS / 'Llama-3.1-8B.json')!r}", test_inner=INNER)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def test_coverage_reports_fired_and_never_fired_rules_and_atoms(pytester):
    result = _inner(pytester, "--rule-coverage", "--rule-coverage-json=cov.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["rule coverage of *rules.yaml: *% (*/* rules fired, */* atom outcomes seen)", "  never fired: *"]
    )
    report = json.loads((pytester.path / "cov.json").read_text())
    never = {r["rule"] for r in report["never_fired"]}
    assert (
        "default-backend.whisper" in never and "fa.fa4-sm90-single-split" not in never
    )  # fa3 on sm90 over cute fired it
    assert 0 < report["rules_fired"] < report["rules"] and report["atoms_not_seen_both_ways"]
    # fa3 on sm90 with nothing else given meets no deviation from SGLang
    assert len(report["deviations_never_applied"]) == report["deviations"] > 0
    result.stdout.fnmatch_lines([f"  deviations exercised: 0/{report['deviations']} (never: sglang.*"])


def test_coverage_counts_a_deviation_a_refused_configuration_exercises(pytester):
    pytester.makepyfile(
        test_refused="""
import pytest
from attngate import ModelFacts, Platform, PlanError, ServerArgs, resolve
from helpers_path import LLAMA

def test_fa3_on_blackwell():
    with pytest.raises(PlanError):
        resolve(ServerArgs(attention_backend="fa3"), ModelFacts.from_hf_config(LLAMA), Platform.from_name("sm100"))
"""
    )
    result = _inner(pytester, "--rule-coverage-json=cov.json")
    assert result.ret == 0
    never = {d["deviation"] for d in json.loads((pytester.path / "cov.json").read_text())["deviations_never_applied"]}
    assert "sglang.registry-refusals-at-start-up" not in never and "sglang.hicache-kernel-io-keeps-fa3-decode" in never


def test_coverage_below_the_threshold_fails_the_session(pytester):
    result = _inner(pytester, "--rule-coverage-fail-under=99")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*FAIL: rule coverage *% is below --rule-coverage-fail-under=99.0"])


KNOWN = """
import pytest
from attngate import ModelFacts, Platform, ServerArgs, resolve
from helpers_path import LLAMA

ARGS = ServerArgs(attention_backend="fa3", speculative_algorithm="EAGLE", speculative_eagle_topk=4,
                  speculative_num_steps=3, speculative_num_draft_tokens=8)

def _run(known_failures):
    model, platform = ModelFacts.from_hf_config(LLAMA), Platform.from_name("sm90")
    ids = known_failures(ARGS, model, platform)
    assert ids == ["known.fa-eagle-tree-verify-drift"]
    return resolve(ARGS, model, platform, allow_known_failures=ids)

def test_still_broken(known_failures):
    _run(known_failures)
    assert False, "the tree verify still drifts"

def test_fixed_meanwhile(known_failures):
    _run(known_failures)

def test_a_config_without_known_failures(known_failures):
    assert known_failures(ServerArgs(), ModelFacts.from_hf_config(LLAMA), Platform.from_name("sm90")) == []
"""


def test_known_failures_fixture_makes_strict_xfails(pytester):
    from tests.support.helpers import MODELS

    pytester.makepyfile(helpers_path=f"LLAMA = {str(MODELS / 'Llama-3.1-8B.json')!r}", test_known=KNOWN)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rxX")
    result.assert_outcomes(passed=1, xfailed=1, failed=1)  # the fixed one XPASSes strictly: a failure to notice
    result.stdout.fnmatch_lines(["*XPASS(strict)*known failure known.fa-eagle-tree-verify-drift*"])


def test_a_resolve_stopped_by_disagreeing_adjustments_still_counts_the_forbid_rules_it_evaluated():
    """fa4 prefill wants 128-token pages and flashmla decode 64: resolve stops in the adjust phase, reporting the
    matching forbid rule too, and coverage sees that rule fire."""
    import pytest

    from attngate import ModelFacts, PlanError, Platform, ServerArgs, resolve
    from attngate.engine.index import OBSERVERS
    from attngate.rules.load import load_rules
    from attngate.testing.coverage import RuleCoverage
    from tests.support.helpers import MODELS

    rules = load_rules()
    coverage = RuleCoverage(rules.filename)
    OBSERVERS.append(coverage.observe)
    try:
        with pytest.raises(PlanError) as err:
            resolve(
                ServerArgs.from_flags(
                    "--prefill-attention-backend fa4 --decode-attention-backend flashmla --attention-backend fa4".split()
                ),
                ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json"),
                Platform.from_name("sm100"),
                rules,
            )
    finally:
        OBSERVERS.remove(coverage.observe)
    assert "page-size.incompatible-backends" in {v.rule for v in err.value.violations}
    never = {r["rule"] for r in coverage.report(rules)["never_fired"]}
    assert "page-size.incompatible-backends" not in never
