"""Replays the corpus of reported failures (tests/corpus/reported_failures.yaml) through ``attngate explain``.

Each report is resolved the way ``attngate explain --gpu GPU --model MODEL --format json -- LINE`` resolves it
(typer's CliRunner on the app), and its verdict is held:

- ``caught``: refused with the rule among the errors' rules, or an adjust rule rewrote a value of the line, or the
  default backend's fallback names the rule as refusing the default it moved off;
- ``explained``: resolved, the rule deciding a gate of an occurring forward mode or a layer kind the model has (or
  adjusting, or a declared deviation), the report's ``gates`` at their values (a rule of a listed gate may be the
  candidate whose condition failed);
- ``outside``: resolved or refused by the rules, never a traceback (nor a line explain cannot read).

Reports whose rule is being written (``pending``) and reports no rule catches (``gap``) are expected failures that
name what is missing; the summary prints how much of the corpus attngate answers.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from attngate import load_rules
from attngate.cli import app
from attngate.cli.app import EXIT_BAD_INPUT
from attngate.engine.fallback import FALLBACK_RULE
from attngate.facts.model import ModelFacts

HERE = Path(__file__).resolve().parent
MODELS = HERE.parents[1] / "examples" / "models"
CORPUS = yaml.safe_load((HERE / "reported_failures.yaml").read_text())["reports"]
BY_ID = {r["id"]: r for r in CORPUS}
VERDICTS = ("caught", "explained", "outside")
_PATCHED = tempfile.TemporaryDirectory(prefix="attngate-corpus-")  # the configs with a report's keys laid over them


def _config(report: dict[str, Any]) -> Path:
    """The model's config.json: the shipped file, or it with the report's ``config`` keys laid over it."""
    base = MODELS / report["model"]
    if not report.get("config"):
        return base
    merged = {**json.loads(base.read_text()), **report["config"]}
    path = Path(_PATCHED.name) / report["id"] / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(merged))
    return path


@cache
def _rule_ids() -> frozenset[str]:
    return frozenset(rule.id for rule in load_rules().rules)


@cache
def replay(report_id: str) -> dict[str, Any]:
    """The report's explain run: exit code, JSON document (None where none was printed), exception, model facts."""
    report = BY_ID[report_id]
    config = _config(report)
    argv = ["explain", "--gpu", report["gpu"], "--model", str(config), "--format", "json"]
    for known_failure in report.get("allow_known_failure") or []:
        if known_failure in _rule_ids():  # one not written yet has nothing to allow
            argv += ["--allow-known-failure", known_failure]
    result = CliRunner().invoke(app, [*argv, "--", *shlex.split(report.get("line") or "")])
    document = None
    if result.stdout.strip().startswith("{"):
        document = json.loads(result.stdout)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    return {
        "exit_code": result.exit_code,
        "document": document,
        "crashed": result.exception if crashed else None,
        "output": result.output,
        "layer_kinds": {k.value for k in ModelFacts.from_hf_config(config).layer_kinds},
    }


def _caught_by(run: dict[str, Any], expected: list[str]) -> set[str]:
    """Rules that refused the line, adjust rules that rewrote a value it gave (warnings), and the rules a default
    backend's fallback names as refusing the default it moved off (``default-backend.fallback``)."""
    doc = run["document"] or {}
    refused = {r for e in doc.get("errors", []) for r in [e.get("rule"), *e.get("rules", [])] if r}
    adjustments = doc.get("adjustments", [])
    rewrote = {a["rule"] for a in adjustments if not a.get("fills_default")}
    fallbacks = [a["message"] for a in adjustments if a["rule"] == FALLBACK_RULE]
    moved_off = {r for r in expected if any(f"({r}" in m or f" {r}," in m or f" {r})" in m for m in fallbacks)}
    return refused | rewrote | moved_off


def _explained_by(run: dict[str, Any]) -> set[str]:
    """Rules that decided a gate where it applies (global gates, occurring modes, layer kinds the model has),
    adjusted the line, or are declared deviations."""
    doc = run["document"] or {}
    tables = [doc.get("gates", {})]
    tables += [t for mode, t in doc.get("modes", {}).items() if mode in doc.get("forward_modes", [])]
    tables += [t for kind, t in doc.get("layers", {}).items() if kind in run["layer_kinds"]]
    decided = {r for table in tables for gate in table.values() for r in gate["rules"]}
    adjusted = {a["rule"] for a in doc.get("adjustments", [])}
    deviations = {d["id"] for d in doc.get("deviations", [])}
    return decided | adjusted | deviations


def _gate_findings(report: dict[str, Any], run: dict[str, Any]) -> tuple[list[str], set[str]]:
    """(mismatches of the report's ``gates``, the rules named by those gates' explanations, candidates included)."""
    gates = (run["document"] or {}).get("gates", {})
    wrong, named = [], set()
    for name, expected in (report.get("gates") or {}).items():
        gate = gates.get(name)
        if gate is None:
            wrong.append(f"{name}: not in the plan")
            continue
        if gate["value"] != expected:
            wrong.append(f"{name}: {gate['value']!r}, expected {expected!r} (rules {gate['rules']})")
        named |= set(gate["rules"]) | {c["rule"] for c in gate["candidates"]}
    return wrong, named


def verdict_problems(report_id: str) -> list[str]:
    """Why the report's verdict does not hold ([] where it does)."""
    report, run = BY_ID[report_id], replay(report_id)
    if run["crashed"] is not None:
        return [f"explain raised {type(run['crashed']).__name__}: {run['crashed']}"]
    verdict, expected = report["verdict"], report.get("rule") or []
    if run["exit_code"] == EXIT_BAD_INPUT:  # the line, model or GPU is not one explain takes: nothing was replayed
        return [f"bad input: {run['output'].strip()[-600:]}"]
    if verdict == "outside":
        return [] if run["document"] is not None or run["exit_code"] != 0 else ["no JSON report"]
    if run["document"] is None:
        return [f"no JSON report (exit {run['exit_code']}): {run['output'][-600:]}"]
    if verdict == "caught":
        fired = _caught_by(run, expected)
        return [
            f"{r} neither refused the line nor rewrote it (fired: {sorted(fired) or 'none'})"
            for r in expected
            if r not in fired
        ]
    if run["exit_code"] != 0:
        return [f"refused (exit {run['exit_code']}) by {sorted(_caught_by(run, []))}, expected a resolved plan"]
    wrong, named = _gate_findings(report, run)
    fired = _explained_by(run)
    return wrong + [f"{r} decides no gate of this plan" for r in expected if r not in fired and r not in named]


def _marks(report: dict[str, Any]) -> list[pytest.MarkDecorator]:
    if report.get("pending"):
        return [pytest.mark.xfail(reason=f"pending rule {report['rule']}: {report['pending_rule']}", strict=False)]
    if report.get("gap"):
        return [pytest.mark.xfail(reason=f"attngate misses it; needs {report['rule']}: {report['gap']}", strict=False)]
    return []


@pytest.mark.parametrize("report_id", [pytest.param(r["id"], marks=_marks(r)) for r in CORPUS])
def test_report_verdict_holds(report_id: str) -> None:
    report = BY_ID[report_id]
    problems = verdict_problems(report_id)
    assert not problems, f"{report['url']} ({report['verdict']}): " + "; ".join(problems)


def test_corpus_entries_are_complete_and_distinct() -> None:
    required = ("id", "url", "title", "model", "gpu", "line", "verdict", "summary")
    problems = [f"{r.get('id')}: no {k}" for r in CORPUS for k in required if k not in r]
    problems += [f"{r['id']}: verdict {r['verdict']!r}" for r in CORPUS if r["verdict"] not in VERDICTS]
    problems += [f"{r['id']}: no rule" for r in CORPUS if r["verdict"] != "outside" and not r.get("rule")]
    problems += [
        f"{r['id']}: {r['model']} is not in examples/models" for r in CORPUS if not (MODELS / r["model"]).is_file()
    ]
    problems += [
        f"{r['id']}: pending without pending_rule" for r in CORPUS if r.get("pending") and not r.get("pending_rule")
    ]
    problems += [f"{r['id']}: pending and gap" for r in CORPUS if r.get("pending") and r.get("gap")]
    assert not problems, problems
    assert len(BY_ID) == len(CORPUS), "ids repeat"
    assert len({r["url"] for r in CORPUS}) == len(CORPUS), "a report is listed twice"
    assert len(CORPUS) >= 50


def test_rules_of_settled_reports_exist(rules) -> None:
    """A caught or explained report that is neither pending nor a gap names rules of rules.yaml."""
    known = {rule.id for rule in rules.rules} | {d.id for d in rules.deviations} | {FALLBACK_RULE}
    unknown = [
        f"{r['id']}: {rule}"
        for r in CORPUS
        if r["verdict"] != "outside" and not r.get("pending") and not r.get("gap")
        for rule in r["rule"]
        if rule not in known
    ]
    assert not unknown, unknown


def test_share_of_reports_attngate_answers() -> None:
    """Of the reports that are an attention-gating matter, at least 90 % are caught or explained. A report that does
    not hold counts as a miss only if it is not pending (its rule being written); the share without the pending
    reports is printed beside it."""
    settled = [r for r in CORPUS if r["verdict"] != "outside"]
    held = [r["id"] for r in settled if not verdict_problems(r["id"])]
    waiting = [r["id"] for r in settled if r.get("pending") and r["id"] not in held]
    missed = [r["id"] for r in settled if r["id"] not in held and r["id"] not in waiting]
    share = 1 - len(missed) / len(settled)
    landed = [r["id"] for r in settled if (r.get("pending") or r.get("gap")) and r["id"] in held]
    print(
        f"\ncorpus: {len(CORPUS)} reports, "
        + ", ".join(f"{v} {sum(r['verdict'] == v for r in CORPUS)}" for v in VERDICTS)
        + f"\nanswered: {len(held)} of {len(settled)} caught or explained, {len(waiting)} pending, {len(missed)} missed:"
        + f" {share:.1%} (without the pending reports {len(held)}/{len(settled) - len(waiting)}"
        + f" = {len(held) / (len(settled) - len(waiting)):.1%})"
        + f"\nmissed: {', '.join(missed) or 'none'}"
        + (f"\nnow firing (drop pending/gap): {', '.join(landed)}" if landed else "")
    )
    assert share >= 0.9, f"{share:.1%} of {len(settled)} reports answered or pending; missed: {missed}"
