"""Generate the docs' reference pages from what drives the code, before ``mkdocs build``:

- ``docs/reference/gates/``: one page per gate of the registry (attngate.plan.registry.GATES): type, default, scope,
  the rules that set it or read it (condition, why, source), the backend and integration code that reads it (file:line,
  found in the source with ``ast``, directly or through a Plan method), the invariants that mention it, the tests that
  assert on it, and how many tests its rules fired in (the rule-coverage report, ``pytest --rule-coverage-json PATH``);
- ``docs/reference/cli.md``: the CLI reference, typer's own ``utils docs`` over the app;
- ``docs/plan.md``: its gate table, between the markers ``PLAN_TABLE_BEGIN`` and ``PLAN_TABLE_END``, from the Plan
  schema (attngate/plan/schema.py, through the registry); the page's prose around the table is hand-written;
- ``docs/benchmarks/``: bench/RESULTS.md and its plots.

The generated folders are not committed (.gitignore), so no page can be stale: CI generates them and builds with
``mkdocs build --strict``. docs/plan.md is committed, and tests/test_docs.py holds it equal to what ``plan_page``
makes of it. Usage::

    python docs/generate.py [--coverage build/rule-coverage.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attngate.plan.registry import GATES, GateSpec  # noqa: E402
from attngate.rules.load import load_rules  # noqa: E402
from attngate.rules.ruleset import Rule, RuleSet  # noqa: E402

DOCS = ROOT / "docs"
CODE_DIRS = ("attngate/backends", "attngate/integrations")


def _gate_named(node: ast.AST) -> str | None:
    """The gate an ``<...>.<group>.<field>`` attribute names (``plan.fa.num_splits``), else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
        name = f"{node.value.attr}.{node.attr}"
        return name if name in GATES else None
    return None


def plan_method_reads() -> dict[str, set[str]]:
    """``{method: {gate, ...}}``: the gates each public method of the Plan reads (``backend_for`` reads
    ``common.runs_on``), found in attngate/plan/schema.py."""
    tree = ast.parse((ROOT / "attngate" / "plan" / "schema.py").read_text())
    plan = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Plan")
    out = {}
    for method in plan.body:
        if isinstance(method, ast.FunctionDef) and not method.name.startswith("_"):
            gates = {g for node in ast.walk(method) if (g := _gate_named(node))}
            if gates:
                out[method.name] = gates
    return out


def code_reads() -> dict[str, list[str]]:
    """``{gate: ["path:line", ...]}``: each ``<...>.<group>.<field>`` attribute read in the backends and
    integrations (``plan.fa.num_splits``, ``gates.common.use_window``), each ``.<field>`` read of a field name
    that only one gate has (``gates.use_window`` after ``gates = plan.layer(kind).common``), and each call of a Plan
    method that reads it (``plan.backend_for(mode)``: ``path:line (Plan.backend_for)``)."""
    by_field: dict[str, list[str]] = {}
    for name, spec in GATES.items():
        by_field.setdefault(spec.field, []).append(name)
    methods = plan_method_reads()
    out: dict[str, list[str]] = {name: [] for name in GATES}
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in methods:
                    for gate in methods[node.func.attr]:
                        out[gate].append(f"{path.relative_to(ROOT)}:{node.lineno} (Plan.{node.func.attr})")
                if not isinstance(node, ast.Attribute) or node.attr not in by_field:
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                group = node.value.attr if isinstance(node.value, ast.Attribute) else None
                named = f"{group}.{node.attr}"
                if named in GATES:
                    out[named].append(where)
                elif len(by_field[node.attr]) == 1 and not isinstance(node.ctx, ast.Store):
                    out[by_field[node.attr][0]].append(where)
    return {
        name: sorted(set(places), key=lambda w: (w.split(":")[0], int(w.split(":")[1].split()[0])))
        for name, places in out.items()
    }


def asserting_tests() -> dict[str, list[str]]:
    """``{gate: ["tests/path.py::test_name", ...]}``: the tests with an ``assert`` (or, in a test that asserts, a
    parametrize argument: a check its assert calls) that names the gate, as an attribute (``plan.fa.num_splits``;
    ``.use_window`` where one gate has that field, as :func:`code_reads` reads it), as a string (``"fa.num_splits"``)
    or through a Plan method that reads it (``plan.heads_per_rank(kind)``): the tests that would fail if its value
    changed, not every test in which one of its rules fired."""
    unique = {
        spec.field: name for name, spec in GATES.items() if sum(s.field == spec.field for s in GATES.values()) == 1
    }
    methods = plan_method_reads()
    out: dict[str, set[str]] = {name: set() for name in GATES}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test_"):
                continue
            checks = [n for n in ast.walk(fn) if isinstance(n, ast.Assert)]
            # a parametrized test's checks may be lambdas among its parameters, which its assert calls
            checks += fn.decorator_list if checks else []
            for check in checks:
                for node in ast.walk(check):
                    literal = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
                    field = unique.get(node.attr) if isinstance(node, ast.Attribute) else None
                    gate = _gate_named(node) or field or (literal if literal in GATES else None)
                    method = getattr(node.func, "attr", None) if isinstance(node, ast.Call) else None
                    for name in ({gate} - {None}) | methods.get(method, set()):
                        out[name].add(f"{path.relative_to(ROOT).as_posix()}::{fn.name}")
    return {name: sorted(tests) for name, tests in out.items()}


def _rule_block(rule: Rule, fired_in: dict[str, list[str]]) -> list[str]:
    lines = [f"### `{rule.id}` ({rule.kind})", "", rule.summary, ""]
    lines += [f"- when: `{' '.join(rule.condition.text.split())}`"]
    if rule.sets:
        lines.append("- sets: " + ", ".join(f"`{k} = {v!r}`" for k, v in rule.sets.items()))
    lines += [f"- why: {' '.join(rule.why.split())}", f"- source: {' '.join(rule.source.split())}"]
    lines += [f"- defined at: `{Path(rule.where).name}`"]
    tests = fired_in.get(rule.id, [])
    lines.append(f"- fired in {len(tests)} test(s)" + (": " + ", ".join(f"`{t}`" for t in tests[:5]) if tests else ""))
    return lines + [""]


def gate_page(
    spec: GateSpec, rules: RuleSet, reads: list[str], fired_in: dict[str, list[str]] | None, asserted: list[str]
) -> str:
    setters = [r for r in rules.rules if spec.name in r.sets]
    readers = [r for r in rules.rules if spec.name in r.condition.reads and r not in setters]
    invariants = [i for i in rules.invariants if spec.name in i.condition.reads]
    lines = [f"# `{spec.name}`", "", spec.doc or "(no description)", ""]
    lines += [
        "| type | default | scope | filled from | read by backends |",
        "|---|---|---|---|---|",
        f"| {spec.type.describe()} | `{spec.default!r}` | {spec.scope} | {spec.from_fact or '-'} | "
        f"{', '.join(spec.read_by) or 'every backend'} |",
        "",
        f"## Rules that set it ({len(setters)})",
        "",
    ]
    for rule in setters:
        lines += _rule_block(rule, fired_in or {})
    if not setters:
        lines += ["None: it takes its default" + (f" or the fact {spec.from_fact}" if spec.from_fact else "") + ".", ""]
    lines += [f"## Rules whose condition reads it ({len(readers)})", ""]
    lines += [f"- `{r.id}` ({r.kind}): {r.summary}" for r in readers] or ["None."]
    lines += ["", f"## Code that reads it ({len(reads)})", ""]
    lines += [f"- `{w}`" for w in reads] or ["No backend or integration code reads it by name."]
    lines += ["", f"## Invariants that mention it ({len(invariants)})", ""]
    lines += [f"- `{i.id}`: {i.summary} (`{' '.join(i.condition.text.split())}`)" for i in invariants] or ["None."]
    lines += ["", f"## Tests that assert on it ({len(asserted)})", ""]
    lines += [f"- `{t}`" for t in asserted] or ["None names it in an assert."]
    lines += [""]
    if fired_in is None:
        lines.append(
            "Generated without a rule-coverage report (pytest --rule-coverage-json PATH; docs/generate.py --coverage PATH)."
        )
    else:
        fired = {t for r in setters + readers for t in fired_in.get(r.id, [])}
        lines.append(f"Its rules fired in {len(fired)} test(s) of the suite (the rule-coverage report).")
    return "\n".join(lines) + "\n"


def gate_pages(out: Path, fired_in: dict[str, list[str]] | None) -> list[str]:
    rules = load_rules()
    reads, asserted = code_reads(), asserting_tests()
    out.mkdir(parents=True, exist_ok=True)
    index = [
        "# Gate reference",
        "",
        "Every gate of the Plan, generated from rules.yaml, the registry and the code.",
        "",
    ]
    index += ["| gate | scope | type | default | rules | code reads | invariants |", "|---|---|---|---|---|---|---|"]
    names = []
    for name, spec in GATES.items():
        page = f"{name}.md"
        (out / page).write_text(gate_page(spec, rules, reads[name], fired_in, asserted[name]))
        setters = sum(name in r.sets for r in rules.rules)
        invariants = sum(name in i.condition.reads for i in rules.invariants)
        index.append(
            f"| [`{name}`]({page}) | {spec.scope} | {spec.type.describe()} | `{spec.default!r}` | {setters} | "
            f"{len(reads[name])} | {invariants} |"
        )
        names.append(name)
    (out / "index.md").write_text("\n".join(index) + "\n")
    return names


PLAN_PAGE = DOCS / "plan.md"
PLAN_TABLE_BEGIN = (
    "<!-- the gate table: generated by docs/generate.py from attngate/plan/schema.py; edit the schema -->"
)
PLAN_TABLE_END = "<!-- end of the generated gate table -->"


def _cell(text: str) -> str:
    """``text`` on one line, its pipes escaped, to sit in one cell of a markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def plan_table() -> list[str]:
    """The lines of docs/plan.md's gate table: one row per gate of the registry, in the schema's order."""
    lines = ["| gate | scope | type | default | read by | meaning |", "|---|---|---|---|---|---|"]
    for name, spec in GATES.items():
        default = f"the fact `{spec.from_fact}`" if spec.from_fact else f"`{spec.default!r}`"
        lines.append(
            f"| [`{name}`](reference/gates/{name}.md) | {spec.scope} | {_cell(spec.type.describe())} | {default} | "
            f"{', '.join(spec.read_by) or 'every backend'} | {_cell(spec.doc)} |"
        )
    return lines


def plan_page(text: str) -> str:
    """docs/plan.md's ``text`` with the lines between its two markers replaced by :func:`plan_table`."""
    lines = text.splitlines()
    if lines.count(PLAN_TABLE_BEGIN) != 1 or lines.count(PLAN_TABLE_END) != 1:
        raise SystemExit(f"{PLAN_PAGE.name} needs each of the table's markers once, on lines of their own")
    begin, end = lines.index(PLAN_TABLE_BEGIN), lines.index(PLAN_TABLE_END)
    return "\n".join([*lines[: begin + 1], "", *plan_table(), "", *lines[end:]]) + "\n"


def cli_page(out: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "typer", "attngate.cli", "utils", "docs", "--name", "attngate", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"typer utils docs failed: {done.stderr}")


def benchmarks(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    (out / "index.md").write_text(text)
    for png in (ROOT / "bench").glob("*.png"):
        shutil.copy(png, out / png.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coverage", type=Path, help="rule-coverage JSON of a test run (pytest --rule-coverage-json)")
    opts = parser.parse_args()
    fired_in = json.loads(opts.coverage.read_text())["fired_in"] if opts.coverage else None
    shutil.rmtree(DOCS / "reference", ignore_errors=True)
    names = gate_pages(DOCS / "reference" / "gates", fired_in)
    PLAN_PAGE.write_text(plan_page(PLAN_PAGE.read_text()))
    cli_page(DOCS / "reference" / "cli.md")
    benchmarks(DOCS / "benchmarks")
    print(f"{len(names)} gate pages, plan.md's gate table, the CLI reference and the benchmarks written under {DOCS}")


if __name__ == "__main__":
    main()
