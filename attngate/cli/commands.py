"""``attngate explain``, ``lint``, ``diff``, ``matrix``, ``flags`` and ``schema``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from attngate.cli.app import (
    EXIT_BAD_INPUT,
    EXIT_INVALID_CONFIG,
    EXIT_UNKNOWN,
    MatrixFormat,
    OutputFormat,
    app,
    fail,
    interrupted,
)

KERNELS_HELP = (
    "the deployment's kernel providers, comma-separated: flashinfer, flash_attn.cute, flash_attn_interface, or a "
    "preset: sglang (a stock SGLang install on the GPU), attngate (pip install attngate[gpu]). Default with --gpu: "
    "sglang; without --gpu: what this host has installed"
)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def explain(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(
        None, "--model", help="config.json, its folder, or a hub id (org/name); or SGLang's --model-path in the flags"
    ),
    gpu: Optional[str] = typer.Option(
        None,
        "--gpu",
        help="GPU: an architecture (sm80, sm90, sm100, 9.0, ...) or a product name (H100, B200, ...); default: detect via torch",
    ),
    kernels: Optional[str] = typer.Option(
        None,
        "--kernels",
        help=KERNELS_HELP,
    ),
    args_file: Optional[Path] = typer.Option(
        None, "--args-file", help="YAML/JSON mapping of server arguments; flags override it"
    ),
    rules: Optional[Path] = typer.Option(None, "--rules", help="rules file (default: the shipped rules.yaml)"),
    mode: Optional[str] = typer.Option(None, "--mode", help="show only this forward mode's per-mode values (any view)"),
    gate: Optional[str] = typer.Option(
        None, "--gate", help="the full why of one gate, e.g. fa.precompute_scheduler_metadata"
    ),
    allow_known_failure: list[str] = typer.Option(
        [], "--allow-known-failure", help="accept this known_failure entry (repeatable): a warning instead of an error"
    ),
    show_all: bool = typer.Option(False, "--all", help="every gate table (global, per forward mode, per layer kind)"),
    output: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table or json"),
) -> None:
    """Resolve the attention plan for an SGLang launch line and explain it: one screen by default, --gate NAME for one
    gate, --all for every table. SGLang's flags as SGLang parses them (aliases, prefixes such as --tp, --config
    server.yaml), or a whole pasted command after --: attngate explain --gpu H100 -- python -m
    sglang.launch_server --model-path org/name --tp 2 ...; flags no rule reads are listed, not refused. The flags
    the rules read, with their values: attngate flags."""
    from attngate.cli.report import error_report, resolution_report
    from attngate.engine.resolve import resolve
    from attngate.errors import AttngateError, PlanError, load_all
    from attngate.facts.model import ModelFacts
    from attngate.facts.modes import ForwardMode
    from attngate.plan.registry import GATES
    from attngate.rules.load import load_rules
    from attngate.types import ViolationKind

    if mode is not None and mode not in {m.value for m in ForwardMode}:
        raise typer.BadParameter(
            f"{mode!r} is not a forward mode: {', '.join(m.value for m in ForwardMode)}", param_hint="--mode"
        )
    from attngate.facts.hub import config_path, same_model
    from attngate.facts.launch import parse_launch_line
    from attngate.facts.server_args import ServerArgs

    line = parse_launch_line(ctx.args, ServerArgs.model_fields)
    for warning in line.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if model and line.model_path and not same_model(model, line.model_path):  # paths resolved, hub ids as text
        raise typer.BadParameter(f"{model} and --model-path {line.model_path} name two models", param_hint="--model")
    if not (model or line.model_path):
        raise typer.BadParameter(
            "name the model: --model PATH|ORG/NAME, or SGLang's --model-path", param_hint="--model"
        )
    try:  # every bad input at once, not only the first
        args, facts, platform, rule_set = load_all(
            lambda: _server_args(line, args_file),
            lambda: ModelFacts.from_hf_config(config_path(model or line.model_path)),
            lambda: _platform(gpu, kernels),
            lambda: load_rules(rules),
        )
    except AttngateError as err:
        raise fail(err) from None
    try:
        resolution = resolve(args, facts, platform, rule_set, allow_known_failures=allow_known_failure)
    except PlanError as err:
        if output is OutputFormat.json:
            typer.echo(json.dumps(error_report(err, rule_set) | {"not_read": line.not_read}, indent=2, default=str))
        else:
            from attngate.cli.render import render_error

            render_error(err)
        # an argument of the call at fault (an --allow-known-failure naming no known_failure rule): bad usage
        bad_usage = all(v.kind is ViolationKind.BAD_ARGUMENT for v in err.violations)
        raise typer.Exit(EXIT_BAD_INPUT if bad_usage else EXIT_INVALID_CONFIG) from None
    occurring = [m.value for m in resolution.forward_modes]
    if mode is not None and mode not in occurring:
        raise typer.BadParameter(
            f"forward mode {mode} does not occur for this model and these flags; it runs {', '.join(occurring)}",
            param_hint="--mode",
        )
    if gate is not None and gate not in GATES:
        from attngate.util.suggest import did_you_mean

        raise typer.BadParameter(f"no gate {gate!r}" + did_you_mean(gate, list(GATES)), param_hint="--gate")
    if output is OutputFormat.json:
        report = resolution_report(resolution, rule_set) | {"not_read": line.not_read}
        if mode:
            report["modes"] = {mode: report["modes"][mode]}
        if gate is not None:  # that gate's entries only, in every table that has it
            report["gates"] = {k: v for k, v in report["gates"].items() if k == gate}
            for key in ("modes", "layers"):
                report[key] = {s: {k: v for k, v in t.items() if k == gate} for s, t in report[key].items()}
        typer.echo(json.dumps(report, indent=2, default=str))
    elif show_all:
        from attngate.cli.render import render_resolution

        render_resolution(resolution, mode)
    else:
        from attngate.cli.plain import print_lines  # rich only where these lines need it
        from attngate.cli.summary import gate_lines, summary_lines

        lines = summary_lines(resolution, mode) if gate is None else gate_lines(resolution, gate, rule_set)
        if line.not_read and gate is None:
            lines[2:2] = [f"not read by any rule: {' '.join(line.not_read)}"]
        print_lines(lines)


def _server_args(line, args_file: Path | None):
    from attngate.facts.server_args import ServerArgs

    base = ServerArgs.from_file(args_file).model_dump(exclude_unset=True) if args_file is not None else {}
    return ServerArgs._validate({**base, **line.values}, line.problems, lambda n: "--" + n.replace("_", "-"))


@app.command()
def lint(
    file: Optional[Path] = typer.Argument(None, help="rules file (default: the shipped rules.yaml)"),
    output: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table or json"),
) -> None:
    """Report every load, schema and type error of a rules file, then its static findings (conflicts, dead rules).
    Exit 0 clean, 1 findings, 2 bad input, 3 a query z3 could not decide (each printed, "unknown"), 130 interrupted."""
    from attngate.errors import RulesError, UsageError
    from attngate.rules.load import load_rules

    try:
        rule_set = load_rules(file)
        from attngate.analysis import require_z3

        require_z3()
        from attngate.analysis.lint import lint_rules
        from attngate.analysis.verdict import Unknown

        results = lint_rules(rule_set)
    except (RulesError, UsageError) as err:
        raise fail(err) from None
    except KeyboardInterrupt:  # Ctrl-C, or SIGINT from a CI timeout (analysis.verdict.Interrupted is one)
        raise interrupted() from None
    unknown = [f for f in results if isinstance(f, Unknown)]
    findings = [f for f in results if not isinstance(f, Unknown)]
    counts = {
        "rules": len(rule_set.rules),
        "predicates": len(rule_set.predicates),
        "invariants": len(rule_set.invariants),
        "deviations": len(rule_set.deviations),
    }
    if output is OutputFormat.json:
        report = {"file": rule_set.filename, **counts, "findings": [_finding(f) for f in findings]}
        typer.echo(json.dumps(report | {"unknown": [_finding(u) for u in unknown]}, indent=2))
    else:
        for finding in [*findings, *unknown]:
            typer.echo(str(finding))
        outcome = f"{len(findings)} finding(s)"
        if unknown:  # never "0 finding(s)" where the solver did not decide every query
            outcome = f"{len(unknown)} unknown (not proved either way)" + (f", {outcome}" if findings else "")
        typer.echo(
            f"{rule_set.filename}: {counts['rules']} rules, {counts['predicates']} predicates, "
            f"{counts['invariants']} invariants, {outcome}"
        )
    if unknown:
        raise typer.Exit(EXIT_UNKNOWN)
    if findings:
        raise typer.Exit(EXIT_INVALID_CONFIG)


def _finding(finding) -> dict[str, str | None]:
    """A lint Finding or Unknown as ``lint --format json`` lists it: the fields an error's problems have."""
    return {"where": finding.where, "code": finding.code, "message": finding.message, "help": finding.help}


@app.command()
def diff(
    old: Path = typer.Argument(..., help="the rules file before the change"),
    new: Path = typer.Argument(..., help="the rules file after it"),
    output: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table or json"),
) -> None:
    """For every gate of every scope (and acceptance and adjustments): does some input make OLD and NEW resolve it
    differently? Each difference with a witness input and the rules responsible on each side.
    Exit 0 equivalent, 1 different, 2 bad input, 3 a query z3 could not decide (each printed, "unknown"), 130
    interrupted."""
    from attngate.analysis import require_z3
    from attngate.errors import AttngateError, load_all
    from attngate.rules.load import load_rules

    try:
        loaded = load_all(lambda: load_rules(old), lambda: load_rules(new))
        require_z3()
        from attngate.analysis.diff import diff_rules

        differences = diff_rules(*loaded)
    except AttngateError as err:
        raise fail(err) from None
    except KeyboardInterrupt:  # Ctrl-C, or SIGINT from a CI timeout (analysis.verdict.Interrupted is one)
        raise interrupted() from None
    unknown = [d for d in differences if d.kind == "unknown"]
    if output is OutputFormat.json:
        import dataclasses

        typer.echo(json.dumps([dataclasses.asdict(d) for d in differences], indent=2, default=str))
    else:
        for d in differences:
            typer.echo(str(d))
        found = len(differences) - len(unknown)
        outcome = f"{found} difference(s)"
        if unknown:  # never "0 difference(s)" where the solver did not decide every query
            outcome = f"{len(unknown)} unknown (not proved either way)" + (f", {outcome}" if found else "")
        typer.echo(f"{old} -> {new}: {outcome}")
    if unknown:
        raise typer.Exit(EXIT_UNKNOWN)
    if differences:
        raise typer.Exit(EXIT_INVALID_CONFIG)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def matrix(
    ctx: typer.Context,
    models: list[Path] = typer.Argument(..., help="config.json files (or folders of them)"),
    gpu: str = typer.Option(..., "--gpu", help="GPU: an architecture (sm90, 9.0) or a product name (H100)"),
    kernels: Optional[str] = typer.Option(
        None,
        "--kernels",
        help=KERNELS_HELP,
    ),
    rules: Optional[Path] = typer.Option(None, "--rules", help="rules file"),
    output: MatrixFormat = typer.Option(
        MatrixFormat.table, "--format", help="table, markdown (the README's table is generated with it) or json"
    ),
) -> None:
    """Print the support matrix: which candidate backend each model can run on this GPU, and why not. SGLang flags
    after the models (or after --) apply to every cell, e.g. --tp 2 --enable-deterministic-inference."""
    from attngate.cli.render import load_model_configs, matrix_cells, matrix_markdown, render_matrix
    from attngate.errors import AttngateError, load_all
    from attngate.facts.launch import parse_launch_line
    from attngate.facts.server_args import ServerArgs
    from attngate.rules.load import load_rules

    # click hands flags it does not know to the variadic MODELS: they start the launch line
    first_flag = next((i for i, m in enumerate(models) if str(m).startswith("-")), len(models))
    line = parse_launch_line([str(m) for m in models[first_flag:]] + ctx.args, ServerArgs.model_fields)
    models = models[:first_flag]
    try:  # every bad input at once, not only the first
        args, configs, platform, rule_set = load_all(
            lambda: _server_args(line, None),
            lambda: load_model_configs(models),
            lambda: _platform(gpu, kernels),
            lambda: load_rules(rules),
        )
    except AttngateError as err:
        raise fail(err) from None
    given = args.model_dump(exclude_unset=True)
    if output is MatrixFormat.markdown:
        typer.echo(matrix_markdown(configs, platform, rule_set, given))
    elif output is MatrixFormat.json:
        backends, rows, reasons = matrix_cells(configs, platform, rule_set, given)
        cells = [
            {"model": name, "cells": {b: {"status": st, "text": text} for b, (st, text) in zip(backends, row)}}
            for name, row in rows
        ]
        report = {"gpu": platform.gpu_arch, "args": given, "backends": backends, "rows": cells, "reasons": reasons}
        typer.echo(json.dumps(report | {"not_read": line.not_read}, indent=2, default=str))
    else:
        render_matrix(configs, platform, rule_set, given)


def _platform(gpu: str | None, kernels: str | None):
    """``--gpu`` and ``--kernels`` as a Platform; without ``--gpu`` both are detected (``--kernels`` still overrides)."""
    from attngate.facts.platform import Platform

    names = [k.strip() for k in kernels.split(",") if k.strip()] if kernels is not None else None
    if gpu:
        return Platform.from_name(gpu, kernels=names)
    detected = Platform.detect()
    return detected if names is None else Platform.from_name(detected.gpu_arch, kernels=names)


@app.command()
def flags(output: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table or json")) -> None:
    """List the server flags the rules read: SGLang's spellings (aliases; unambiguous prefixes work too), the values
    each takes and its default. Every other SGLang flag is accepted by explain and listed as not read."""
    from attngate.facts.launch import flag_catalogue
    from attngate.facts.server_args import ServerArgs

    rows = flag_catalogue(ServerArgs.model_fields)
    if output is OutputFormat.json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    for row in rows:
        doc = f"  {row['description']}" if row["description"] else ""
        typer.echo(f"{'  '.join(row['flags'])}  ({row['takes']}, default {row['default']!r}){doc}")


@app.command()
def schema() -> None:
    """Print the JSON Schema of rules.yaml (for editors)."""
    from attngate.rules.spec import RuleFileSpec

    typer.echo(json.dumps(RuleFileSpec.model_json_schema(), indent=2))
