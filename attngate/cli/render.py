"""Rich rendering of explanations, errors and the support matrix."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from attngate.cli.plain import as_written, print_lines, rich_console  # the plain-text screen, without rich where it can
from attngate.engine.result import GateExplanation, Resolution
from attngate.errors import MAX_PROBLEMS, PlanError

if TYPE_CHECKING:
    from attngate.facts.model import ModelFacts


def _console() -> Console:
    return rich_console()


def _shown(text: Any) -> str:
    """Text from an input (a config value, a rule's message or id, a path) as rich markup: controls and bidi
    characters made visible and what the output's encoding cannot hold escaped (attngate.cli.plain.as_written),
    markup characters escaped."""
    return escape(as_written(str(text)))


def _facts(facts: dict[str, Any]) -> str:
    return _shown(", ".join(f"{k}={v!r}" for k, v in facts.items()))


def _why(e: GateExplanation) -> str:
    lines = []
    if e.rules:
        lines.append(_facts(e.facts))
    for c in e.candidates:
        lines.append(f"[dim]{_shown(c.rule)}: failed {_shown('; '.join(c.failed))}[/dim]")
    if not e.rules and e.facts:
        lines.append(f"[dim]read {_facts(e.facts)}[/dim]")
    return "\n".join(lines)


def _gate_table(title: str, gates: dict[str, GateExplanation]) -> Table:
    table = Table(title=title, show_lines=True, title_justify="left")
    for name in ("gate", "value", "origin", "facts read / candidates that did not match"):
        table.add_column(name, overflow="fold")  # wrapped, never cut short with an ellipsis
    for name, e in gates.items():
        origin = f"[green]{_shown(e.origin)}[/green]" if e.rules else f"[dim]{_shown(e.origin)}[/dim]"
        table.add_row(_shown(name), _shown(repr(e.value)), origin, _why(e))
    return table


def render_resolution(r: Resolution, mode: str | None) -> None:
    """Every table (``--all``; ``mode``: only that forward mode's) of the modes and layer kinds that occur: rich tables on a terminal of 120 columns or more (four columns of rule
    ids and conditions need them), else plain lines."""
    console = _console()
    if not console.is_terminal or console.width < 120:
        from attngate.cli.summary import all_lines

        print_lines(all_lines(r, mode))
        return
    plan, e = r.plan, r.explanation
    console.print(
        f"[bold]attention plan[/bold]  model={_shown(r.model.source)}  gpu={r.platform.gpu_arch}  "
        f"kernels={_shown(r.platform.kernel_set)}"
    )
    console.print(
        f"  prefill_backend=[bold]{plan.prefill_backend}[/bold]  decode_backend=[bold]{plan.decode_backend}[/bold]  fingerprint={plan.fingerprint[:16]}"
    )
    console.print(_gate_table("global gates", e.gates))
    for m in r.forward_modes:
        if mode in (None, m.value):
            console.print(_gate_table(f"forward mode {m.value}", e.modes[m.value]))
    for kind, gates in e.layers.items():
        if kind in {k.value for k in r.model.layer_kinds}:
            console.print(_gate_table(f"layer kind {kind}", gates))
    if r.adjustments:
        table = Table(title="adjustments", title_justify="left")
        for col in ("server argument", "from", "to", "rule", "message"):
            table.add_column(col, overflow="fold")
        for a in r.adjustments:
            style = "" if a.fills_default else "yellow"
            table.add_row(*(_shown(x) for x in (a.field, repr(a.old), repr(a.new), a.rule, a.message)), style=style)
        console.print(table)
    from attngate.cli.summary import deviation_lines

    for line in deviation_lines(r.deviations):
        console.print(Text(as_written(line)), overflow="fold")
    for w in r.warnings:
        console.print(f"[yellow]warning:[/yellow] {_shown(w)}")
    table = Table(title="candidate backends", title_justify="left")
    for col in ("backend", "status", "reasons"):
        table.add_column(col, overflow="fold")
    for b in e.backends:
        color = {"chosen": "green", "accepted": "cyan", "rejected": "red"}[b.status]
        table.add_row(_shown(b.backend), f"[{color}]{b.status}[/{color}]", _shown("\n".join(b.reasons)))
    console.print(table)


def render_error(err: PlanError) -> None:
    console = _console()
    console.print(f"[red bold]invalid configuration[/red bold] ({len(err.violations)} reason(s)):")
    for v in err.violations[:MAX_PROBLEMS]:
        facts = f"  [dim]({_facts(v.facts)})[/dim]" if v.facts else ""
        issue = _shown(f" [{v.issue}]") if v.issue else ""
        opt_in = (
            _shown(f" (a known failure: --allow-known-failure {v.rule} accepts it)")
            if v.kind == "known_failure"
            else ""
        )
        help_line = f"\n      help: {_shown(v.help)}" if v.help else ""
        console.print(f"  [red]-[/red] {_shown(v.where)}: {_shown(v.message)}{issue}{opt_in}{facts}{help_line}")
    if len(err.violations) > MAX_PROBLEMS:
        console.print(f"  [red]-[/red] and {len(err.violations) - MAX_PROBLEMS} more")
    for a in err.adjustments:
        console.print(f"  [dim]adjusted {_shown(a)}[/dim]")
    if err.candidates:
        console.print("candidate backends (--attention-backend, ServerArgs.attention_backend):")
        for backend, rules in err.candidates.items():
            verdict = "[green]runs this[/green]" if not rules else f"refused by {_shown(', '.join(rules))}"
            console.print(f"  {_shown(backend):<12} {verdict}")
    from attngate.cli.summary import deviation_lines

    for line in deviation_lines(err.deviations, brief=True):  # a refusal stays one screen: reasons in the rules file
        console.print(Text(as_written(line)), overflow="fold")


def load_model_configs(paths: list[Path]) -> list[tuple[str, ModelFacts]]:
    """(name, facts) per config.json in ``paths`` (files, or folders of them). Raises ModelConfigError for an empty
    list, or every bad config's error at once (attngate.errors.load_all)."""
    from attngate.errors import ModelConfigError, Problem, load_all
    from attngate.facts.model import ModelFacts
    from attngate.util.inputs import is_directory

    files = [p for path in paths for p in (sorted(path.glob("*.json")) if is_directory(path) else [path])]
    if not files:
        raise ModelConfigError(
            Problem("MODELS", f"no config.json files in {', '.join(map(str, paths))}", code="model-config.no-models")
        )
    facts = load_all(*(lambda f=f: ModelFacts.from_hf_config(f) for f in files))
    return [(f.stem, m) for f, m in zip(files, facts)]


def matrix_cells(
    configs: list[tuple[str, ModelFacts]], platform, rule_set, args: dict[str, Any] | None = None
) -> tuple[list[str], list[tuple[str, list[tuple[str, str]]]], dict[str, str]]:
    """(backends, rows, reasons): per model config, per candidate backend, (status, text) with status ok | moved | no
    (text ``no: RULE, ...``); ``reasons`` maps each refusing rule id to its message. ``args``: server arguments every
    cell also takes (a launch line's), the column's backend on top."""
    from attngate.engine.resolve import resolve
    from attngate.facts.server_args import ServerArgs
    from attngate.plan.backends import CANDIDATE_BACKENDS

    rows, reasons = [], {}
    for name, model in configs:
        cells = []
        for backend in CANDIDATE_BACKENDS:
            try:
                r = resolve(ServerArgs(**{**(args or {}), "attention_backend": backend}), model, platform, rule_set)
                moved = r.plan.prefill_backend != backend or r.plan.decode_backend != backend
                cells.append(
                    ("moved", f"-> {r.plan.prefill_backend}/{r.plan.decode_backend}") if moved else ("ok", "ok")
                )
            except PlanError as err:
                cells.append(("no", "no: " + ", ".join(v.where for v in err.violations)))
                reasons.update((v.where, v.message) for v in err.violations if v.where not in reasons)
        rows.append((name, cells))
    return list(CANDIDATE_BACKENDS), rows, reasons


def matrix_title(platform) -> str:
    return f"support matrix on {platform.gpu_arch} with {platform.kernel_set}"


def render_matrix(
    configs: list[tuple[str, ModelFacts]], platform, rule_set, args: dict[str, Any] | None = None
) -> None:
    """The matrix for a terminal: a refusal is ``no`` with note numbers, the notes (rule id and message) below, so
    that cells stay narrow and the model names whole at 80 columns."""
    backends, rows, reasons = matrix_cells(configs, platform, rule_set, args)
    colour = {"ok": "green", "moved": "yellow", "no": "red"}
    notes: dict[str, int] = {}  # rule id -> note number, in first-use order

    def cell(status: str, text: str) -> str:
        if status == "no":
            numbers = [notes.setdefault(rule, len(notes) + 1) for rule in text.removeprefix("no: ").split(", ")]
            text = "no " + ",".join(map(str, numbers))
        return f"[{colour[status]}]{_shown(text)}[/{colour[status]}]"

    table = Table(title=matrix_title(platform), show_lines=False, title_justify="left")
    table.add_column("model", no_wrap=True)
    for b in backends:
        table.add_column(b, overflow="fold")  # wrapped, never cut short with an ellipsis
    for name, cells in rows:
        table.add_row(_shown(name), *[cell(status, text) for status, text in cells])
    console = _console()
    console.print(table)
    for rule, number in notes.items():
        console.print(f"[red]{number}[/red] [bold]{_shown(rule)}[/bold]: {_shown(reasons[rule])}", overflow="fold")


def matrix_markdown(
    configs: list[tuple[str, ModelFacts]], platform, rule_set, args: dict[str, Any] | None = None
) -> str:
    """The support matrix as a Markdown table (the README's is generated by this; CI checks it for drift)."""
    backends, rows, _ = matrix_cells(configs, platform, rule_set, args)
    lines = [
        f"{matrix_title(platform)}: `ok`, `-> prefill/decode` (rules moved it), or `no:` with the rules that refuse it",
        "",
        "| model | " + " | ".join(backends) + " |",
        "|---|" + "---|" * len(backends),
    ]
    lines += [f"| {name} | " + " | ".join(text for _, text in cells) + " |" for name, cells in rows]
    return as_written("\n".join(lines))
