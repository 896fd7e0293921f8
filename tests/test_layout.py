"""The package's shape (../shared/DESIGN.md, "Layout"): the floors themselves are import-linter contracts
(pyproject.toml, run by .ci/run); these add what its contracts do not say."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "attngate"
MAX_LINES = 400  # the project standard: modules of about 400 lines at most


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("attngate")  # function-local imports included


def test_no_import_cycle_among_attngate_modules(graph: grimp.ImportGraph) -> None:
    cycles = []
    for importer in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported != importer and graph.find_shortest_chain(importer=imported, imported=importer):
                cycles.append(f"{importer} -> {imported}")
    assert not cycles, cycles


def test_no_module_passes_the_line_limit() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long
