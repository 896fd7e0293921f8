"""pytest plugin (entry point ``pytest11``): rule coverage of the shipped rules.yaml over a test session,
and the ``known_failures`` fixture.

``--rule-coverage`` reports which rules fired over every resolve() of the session, which never did,
which atoms of their conditions were not seen both true and false, and which deviations (``deviations:``,
where attngate differs from SGLang on purpose) no resolved configuration exercised;
``--rule-coverage-fail-under=PCT`` fails the session below PCT percent (rules fired plus atom
outcomes seen, over rules plus twice the atoms); ``--rule-coverage-json=PATH`` writes the full report, with the
tests in which each rule fired (``fired_in``).
"""

from __future__ import annotations

import json

import pytest

_KEY = pytest.StashKey[object]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attngate", "attngate rule coverage")
    group.addoption("--rule-coverage", action="store_true", help="report rule coverage of the shipped rules.yaml")
    group.addoption(
        "--rule-coverage-fail-under", type=float, default=None, metavar="PCT", help="fail below PCT percent"
    )
    group.addoption("--rule-coverage-json", default=None, metavar="PATH", help="write the coverage report as JSON")


def pytest_configure(config: pytest.Config) -> None:
    opts = config.option
    if not (opts.rule_coverage or opts.rule_coverage_fail_under is not None or opts.rule_coverage_json):
        return
    from attngate.engine.index import DEVIATION_OBSERVERS, OBSERVERS
    from attngate.rules.load import shipped_rules_path
    from attngate.testing.coverage import RuleCoverage

    coverage = RuleCoverage(str(shipped_rules_path()))
    OBSERVERS.append(coverage.observe)
    DEVIATION_OBSERVERS.append(coverage.observe_deviations)
    config.stash[_KEY] = coverage


def pytest_unconfigure(config: pytest.Config) -> None:
    coverage = config.stash.get(_KEY, None)
    if coverage is not None:
        from attngate.engine.index import DEVIATION_OBSERVERS, OBSERVERS

        OBSERVERS.remove(coverage.observe)
        DEVIATION_OBSERVERS.remove(coverage.observe_deviations)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Attribute the rules that fire during a test to it (the report's ``fired_in``; the docs' gate pages list them)."""
    coverage = item.config.stash.get(_KEY, None)
    if coverage is not None:
        coverage.current_test = item.nodeid
    try:
        return (yield)
    finally:
        if coverage is not None:
            coverage.current_test = None


@pytest.fixture
def known_failures(request: pytest.FixtureRequest):
    """``known_failures(server_args, model, platform, rules=None) -> list[str]``: the ids of the known_failure
    entries the configuration matches. When it matches some (and nothing else refuses it), the calling test
    becomes a strict xfail naming them, so the test can run the configuration with
    ``resolve(..., allow_known_failures=ids)``; once the failure is fixed the test XPASSes and fails the run."""

    def check(server_args, model, platform, rules=None) -> list[str]:
        from attngate.engine.resolve import resolve
        from attngate.errors import PlanError

        try:
            resolve(server_args, model, platform, rules)
        except PlanError as err:
            known = [v for v in err.violations if v.kind == "known_failure"]
            if known and len(known) == len(err.violations):
                reason = "; ".join(
                    f"known failure {v.rule}: {v.message}" + (f" ({v.issue})" if v.issue else "") for v in known
                )
                request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))
                return [v.rule for v in known]
        return []

    return check


def _report(config: pytest.Config) -> dict | None:
    coverage = config.stash.get(_KEY, None)
    if coverage is None:
        return None
    from attngate.rules.load import load_rules

    return coverage.report(load_rules())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    report = _report(session.config)
    if report is None:
        return
    path = session.config.option.rule_coverage_json
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
    threshold = session.config.option.rule_coverage_fail_under
    if threshold is not None and report["percent"] < threshold and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    report = _report(config)
    if report is None:
        return
    write = terminalreporter.write_line
    write(
        f"rule coverage of {report['file']}: {report['percent']}% ({report['rules_fired']}/{report['rules']} rules fired, "
        f"{report['atom_outcomes_seen']}/{2 * report['atoms']} atom outcomes seen)"
    )
    if report["never_fired"]:
        write("  never fired: " + ", ".join(r["rule"] for r in report["never_fired"]))
    unused = report["deviations_never_applied"]
    write(
        f"  deviations exercised: {report['deviations'] - len(unused)}/{report['deviations']}"
        + (" (never: " + ", ".join(d["deviation"] for d in unused) + ")" if unused else "")
    )
    threshold = config.option.rule_coverage_fail_under
    if threshold is not None and report["percent"] < threshold:
        write(f"  FAIL: rule coverage {report['percent']}% is below --rule-coverage-fail-under={threshold}")
