"""docs/adding-a-gate.md's worked example, walked: its diffs applied to a copy of the repository touch the schema,
rules.yaml, the one backend module that reads the gate and their tests, and nothing else; lint accepts the rule and
the example's tests pass there. The example cannot fall behind the code it shows."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding-a-gate.md"
#: what adding a boolean gate read by FlashInfer with one rule touches (issue 54)
TOUCHED = {
    "attngate/plan/schema.py",
    "rules.yaml",
    "attngate/backends/flashinfer_plans.py",
    "tests/engine/shipped/test_flashinfer.py",
    "tests/backends/test_flashinfer_planner.py",
}


def _diffs() -> list[str]:
    return re.findall(r"```diff\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_example_touches_the_schema_the_rules_one_backend_module_and_their_tests():
    touched = {m for diff in _diffs() for m in re.findall(r"^\+\+\+ b/(\S+)$", diff, flags=re.M)}
    assert touched == TOUCHED


@pytest.fixture(scope="module")
def walked(tmp_path_factory) -> Path:
    """A copy of the project's code, rules and tests with the example's diffs applied."""
    if shutil.which("git") is None:
        pytest.fail("git applies the example's diffs (git apply): install git")
    copy = tmp_path_factory.mktemp("walked")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("attngate", "tests", "examples/models"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    for name in ("rules.yaml", "pyproject.toml"):
        shutil.copy(ROOT / name, copy / name)
    for i, diff in enumerate(_diffs()):
        patch = copy / f"example-{i}.diff"
        patch.write_text(diff)
        done = subprocess.run(["git", "apply", patch.name], cwd=copy, capture_output=True, text=True)
        assert done.returncode == 0, f"docs/adding-a-gate.md diff {i + 1} no longer applies:\n{done.stderr}"
    return copy


def _run(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(copy), "ATTNGATE_NO_CACHE": "1"}
    return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=600)


def test_the_walked_copy_imports_its_own_attngate(walked):
    done = _run(walked, "-c", "import attngate; print(attngate.__file__)")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(walked)


def test_lint_accepts_the_example_rule(walked):
    done = _run(walked, "-m", "attngate", "lint", "rules.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 finding(s)" in done.stdout


def test_the_examples_tests_pass(walked):
    done = _run(
        walked,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/engine/shipped/test_flashinfer.py",
        "-k",
        "fp16",
        "tests/backends/test_flashinfer_planner.py",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout
