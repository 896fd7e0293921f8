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


def test_every_problem_attngate_constructs_names_its_kind():
    """Each ``Problem(...)`` in attngate's source passes its own ``code`` (a kind such as ``server-args.unknown-flag``),
    so that a tool matching on errors never has to read message text."""
    import ast
    from pathlib import Path

    import attngate

    root = Path(attngate.__file__).parent
    missing = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Problem":
                if len(node.args) < 3 and not any(k.arg == "code" for k in node.keywords):
                    missing.append(f"{name}:{node.lineno}")
    assert missing == []


def test_every_error_class_lives_in_errors_py():
    """attngate's error types are declared in attngate/errors.py (and re-exported where callers import them), so one
    module lists every kind of error the project raises with its code."""
    import ast
    from pathlib import Path

    import attngate
    from attngate import errors

    names = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)}
    root = Path(attngate.__file__).parent
    elsewhere = [
        f"{path.relative_to(root.parent).as_posix()}:{node.lineno} {node.name}"
        for path in sorted(root.rglob("*.py"))
        if path.name != "errors.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) in names for b in node.bases)
    ]
    assert elsewhere == []


def _problems_of(call) -> list[Problem]:
    from attngate.errors import AttngateError

    with pytest.raises(AttngateError) as err:
        call()
    return err.value.problems


def test_the_known_error_paths_give_each_problem_a_code_of_its_kind_and_suggestions_as_help():
    from attngate import ModelFacts, Plan

    plan = resolve(ServerArgs(), model("Llama-3.1-8B"), Platform.from_name("sm90")).plan
    misspelt_plan = plan.to_json().replace('"num_splits"', '"num_split"', 1)
    paths = {
        "flags": lambda: ServerArgs.from_flags(["--attention-backnd", "fa3", "--page-size"]),
        "platform": lambda: Platform.from_name("sm99"),
        "rules": lambda: parse_rules("version: 1\nrulez: []\n", "r.yaml"),
        "plan JSON": lambda: Plan.from_json("{"),
        "plan keys": lambda: Plan.from_json(misspelt_plan),
        "model config": lambda: ModelFacts.from_hf_dict({"model_type": "llama", "num_attention_heads": "x"}),
        "known failures": lambda: resolve(
            ServerArgs(), model("Llama-3.1-8B"), Platform.from_name("sm90"), allow_known_failures=["known.fa-eagle"]
        ),
    }
    for path, call in paths.items():
        problems = _problems_of(call)
        assert problems, path
        for p in problems:
            assert p.code and "." in p.code, (path, p)  # the error type's area, then the kind
            assert "did you mean" not in p.message, (path, p)
    suggested = {path: [p.help for p in _problems_of(call) if p.help] for path, call in paths.items()}
    assert suggested["flags"] == ["did you mean '--attention-backend'?"]
    assert suggested["platform"] and suggested["rules"] == ["did you mean 'rules'?"]
    assert suggested["plan keys"] == ["did you mean 'num_splits'?"]


def test_a_commands_json_errors_are_structured_problems(tmp_path, capsys):
    from attngate.cli import main

    bad = tmp_path / "r.yaml"
    bad.write_text("version: 1\nrulez: []\n")
    with pytest.raises(SystemExit):
        main(["lint", str(bad), "--format", "json"])
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert errors and all(set(e) == {"where", "code", "message", "help"} for e in errors)
    assert {"code": "rules.unknown-key", "help": "did you mean 'rules'?"}.items() <= errors[0].items()
