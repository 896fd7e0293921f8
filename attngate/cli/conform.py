"""``attngate conform``: the shipped rules against SGLang's own resolution (needs the sglang extra)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from attngate.cli.app import (
    EXIT_BAD_INPUT,
    EXIT_INVALID_CONFIG,
    OutputFormat,
    app,
    fail,
)
from attngate.facts.choices import SGLANG_VERSION

CONFORM_HELP = (
    f"Run every case through SGLang {SGLANG_VERSION}'s resolution and through resolve(); report agreement per field, "
    "the declared deviations (rules.yaml `deviations:`) and every undeclared difference. Exit 1 on any undeclared one."
)


@app.command(help=CONFORM_HELP)
def conform(
    cases: Optional[Path] = typer.Option(
        None,
        "--cases",
        help='JSON list of {"name", "model_config", "gpu", "args": {SGLang ServerArgs field: value} or a launch line}',
    ),
    generate: Optional[Path] = typer.Option(
        None,
        "--generate",
        help="a folder of config.json files: cases over it, the GPUs and every two of the rules' argument values",
    ),
    gpu: str = typer.Option("sm80,sm90,sm100", "--gpu", help="with --generate: comma-separated GPU architectures"),
    rules: Optional[Path] = typer.Option(None, "--rules", help="rules file (default: the shipped rules.yaml)"),
    jobs: int = typer.Option(2, "--jobs", min=1, help="cases resolved in parallel processes"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="run only the first N cases"),
    output: OutputFormat = typer.Option(
        OutputFormat.table, "--format", help="table, or json with both sides' values per case"
    ),
) -> None:
    """``attngate conform``: its help is ``CONFORM_HELP``, which names the SGLang version (``SGLANG_VERSION``)."""
    from attngate.errors import AttngateError, Problem, UsageError
    from attngate.integrations.sglang.cases import generate_cases, load_cases
    from attngate.integrations.sglang.conform import run_cases, summarize
    from attngate.integrations.sglang.fields import sglang_field_names
    from attngate.integrations.sglang.oracle import require_sglang
    from attngate.rules.load import load_rules

    try:
        if (cases is None) == (generate is None):
            raise UsageError(Problem("--cases/--generate", "give exactly one of them", code="usage.exclusive-options"))
        require_sglang()
        rule_set = load_rules(rules)
        if cases is not None:
            chosen = load_cases(cases, sglang_field_names())
        else:
            models = sorted(generate.glob("*.json")) + sorted(generate.glob("*/config.json"))
            if not models:
                raise UsageError(
                    Problem("--generate", f"{generate} holds no *.json or */config.json", code="usage.no-models")
                )
            chosen = generate_cases(models, [g.strip() for g in gpu.split(",") if g.strip()], rule_set)
    except AttngateError as err:
        raise fail(err, EXIT_BAD_INPUT) from None
    chosen = chosen[:limit] if limit else chosen
    start = time.monotonic()
    results = _run_with_progress(chosen, rule_set, jobs, run_cases, quiet=output == OutputFormat.json)
    seconds = time.monotonic() - start
    summary = summarize(results)
    if output == OutputFormat.json:
        typer.echo(
            json.dumps(
                {
                    "cases": len(results),
                    "seconds": round(seconds, 1),
                    "verdicts": summary.verdicts,
                    "fields": summary.fields,
                    "deviations": summary.deviations,
                    "results": [r.to_json() for r in results],
                },
                default=str,
            )
        )
    else:
        _print_table(results, summary, seconds)
    if summary.undeclared:
        raise typer.Exit(EXIT_INVALID_CONFIG)


def _run_with_progress(cases, rules, jobs, run_cases, *, quiet: bool):
    if quiet or not sys.stderr.isatty():
        return run_cases(cases, rules, jobs=jobs)
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task("SGLang vs attngate", total=len(cases))
        return run_cases(cases, rules, jobs=jobs, progress=lambda _: progress.advance(task))


def _print_table(results, summary, seconds: float) -> None:
    from attngate.integrations.sglang.compare import Verdict

    typer.echo(f"{len(results)} cases in {seconds:.1f} s")
    for verdict, count in summary.verdicts.items():
        typer.echo(f"  {verdict:<26} {count}")
    if summary.fields:
        typer.echo("per field (cases that differ):")
        for name, counts in summary.fields.items():
            typer.echo(
                f"  {name:<36} declared {counts.get('declared', 0):>5}   undeclared {counts.get('undeclared', 0):>5}"
            )
    if summary.deviations:
        typer.echo("declared deviations (rules.yaml deviations:) and the cases each covers:")
        for deviation, count in summary.deviations.items():
            typer.echo(f"  {deviation:<58} {count:>5}")
    undeclared = [r for r in results if r.verdict in (Verdict.DISAGREE, Verdict.ONE_REFUSES)]
    if undeclared:
        typer.echo("undeclared differences (field: SGLang -> attngate [attngate's rule]):")
    for result in undeclared:
        for name, (sglang, mine) in result.differences.items():
            if not result.declared.get(name):
                origin = f" [{result.origins[name]}]" if name in result.origins else ""
                typer.echo(f"  {result.name}: {name}: {sglang!r} -> {mine!r}{origin}")
