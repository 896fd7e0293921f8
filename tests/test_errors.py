"""Errors: every problem carries a stable code (its error type's, or its own) and an optional help line; a
violation names its source apart from the ids of the rules involved."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attngate import PlanError, Platform, ServerArgs, resolve
from attngate.cli import app
from attngate.errors import BackendRefusal, Problem, ServerArgsError
from attngate.rules.load import parse_rules
from tests.support.helpers import model


def test_a_problem_takes_its_error_types_code_unless_it_names_its_own():
    err = ServerArgsError([Problem("--tp-size", "bad"), Problem("--dp-size", "bad", code="server-args.range")])
    assert [p.code for p in err.problems] == ["server-args", "server-args.range"]
    assert BackendRefusal("no").problems[0].code == "backend-refusal"


def test_a_help_line_is_printed_under_its_problem():
    err = ServerArgsError(Problem("--page-size", "must be positive", help="pass --page-size 16"))
    assert str(err).splitlines()[1:] == ["  - --page-size: must be positive", "    help: pass --page-size 16"]


def test_what_no_rule_decides_is_the_engines_violation_with_help():
    bare = parse_rules("version: 1\nrules: []\n", "bare.yaml")
    with pytest.raises(PlanError) as err:
        resolve(ServerArgs(), model("Llama-3.1-8B"), Platform.from_name("sm90"), bare)
    sides = err.value.violations
    assert [(v.source, v.kind, v.rule, v.rules, v.where) for v in sides] == [
        ("engine", "unresolved", None, (), "attngate")
    ] * 2
    assert {p.code for p in err.value.problems} == {"plan.unresolved"}
    assert all(p.help == "pass --attention-backend" for p in err.value.problems)


def test_an_unknown_known_failure_id_is_a_violation_of_the_argument():
    with pytest.raises(PlanError) as err:
        resolve(
            ServerArgs(attention_backend="fa3"),
            model("Llama-3.1-8B"),
            Platform.from_name("sm90"),
            allow_known_failures=["no-such-rule"],
        )
    (v,) = err.value.violations
    assert (v.source, v.kind, v.argument, v.rule, v.where) == (
        "argument",
        "bad_argument",
        "allow_known_failures",
        None,
        "allow_known_failures",
    )


def test_the_json_report_gives_each_error_its_source_and_code(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "explain",
            "--model",
            "examples/models/DeepSeek-V3.json",
            "--gpu",
            "sm100",
            "--format",
            "json",
            "--",
            "--attention-backend",
            "fa3",
        ],
    )
    out = json.loads(res.stdout)
    assert out["version"] == 3 and out["plan"] is None and out["errors"]
    assert set(out["rules"]) >= {e["rule"] for e in out["errors"] if e["rule"]}  # each refusing rule's why and source
    assert all(r["why"] and r["source"] and ":" in r["where"] for r in out["rules"].values())
    for e in out["errors"]:
        assert e["source"] in ("rule", "rules", "engine", "argument") and e["code"] == f"plan.{e['kind']}"
        assert (e["rule"] is not None) == (e["source"] == "rule") and (e["rules"] == [e["rule"]]) == (
            e["source"] == "rule"
        )


@pytest.mark.parametrize("value", [None, b"{}", {}, ["x"]])
def test_a_library_call_given_the_wrong_type_names_the_parameter(value):
    from attngate import ModelFacts, Plan, UsageError

    for call, parameter in [
        (lambda: Plan.from_json(value), "text"),
        (lambda: parse_rules(value), "text"),
        (lambda: ModelFacts.from_hf_dict(value), "raw"),
    ]:
        if parameter == "raw" and isinstance(value, dict):
            continue  # a mapping is what from_hf_dict takes
        with pytest.raises(UsageError) as err:
            call()
        assert err.value.problems[0].where == parameter
