"""CLI conventions (attngate.cli.main): under --format json every error is JSON on stdout with the same exit code as
without; a closed pipe ends the program quietly; --version."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attngate.cli import main
from tests.support.helpers import MODELS, ROOT

LLAMA = ["--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm90"]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


@pytest.mark.parametrize(
    "argv, where",
    [
        (["explain", *LLAMA, "--mode", "dcode"], "--mode"),  # a usage error of attngate's own option
        (["explain", "--model", "missing.json", "--gpu", "sm90"], "missing.json"),  # bad input, every problem
        (["explain", *LLAMA, "--", "--attention-backnd", "fa3"], "--attention-backnd"),  # an SGLang flag misspelled
        (["explain", *LLAMA, "--gpu", "sm99"], "--gpu"),
    ],
)
def test_errors_are_json_under_format_json_with_the_same_exit_code(argv, where, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2 and not out and where in err
    json_code, json_out, _ = run([*argv[:1], "--format", "json", *argv[1:]], capsys)
    report = json.loads(json_out)
    assert json_code == 2 and report["plan"] is None and report["exit_code"] == 2
    assert any(where in (e["where"] or "") + e["message"] for e in report["errors"]), report


def test_an_invalid_configuration_is_exit_1_in_both_formats(capsys):
    argv = [
        "explain",
        "--model",
        str(MODELS / "gpt-oss-20b.json"),
        "--gpu",
        "sm90",
        "--attention-backend",
        "flashinfer",
    ]
    assert run(argv, capsys)[0] == 1
    code, out, _ = run([*argv, "--format", "json"], capsys)
    assert code == 1 and json.loads(out)["errors"]


def test_a_launch_lines_own_format_flag_does_not_switch_attngate_to_json(capsys):
    code, out, err = run(["explain", *LLAMA, "--", "--attention-backnd", "x", "--format", "json"], capsys)
    assert code == 2 and not out and "--attention-backnd" in err


def test_a_closed_pipe_ends_quietly():
    cmd = f"{sys.executable} -m attngate explain {' '.join(LLAMA)} --all | head -1"
    done = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("attention plan:") and done.stderr == ""


def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.startswith("attngate ")


def test_matrix_takes_a_launch_line_and_prints_json(capsys):
    argv = ["matrix", str(MODELS / "DeepSeek-V3.json"), "--gpu", "sm90", "--format", "json"]
    code, out, _ = run([*argv, "--tp", "2", "--enable-deterministic-inference", "--port", "3000"], capsys)
    report = json.loads(out)
    assert code == 0 and report["args"] == {"tp_size": 2, "enable_deterministic_inference": True}
    assert report["not_read"] == ["--port"] and report["rows"][0]["model"] == "DeepSeek-V3"
    assert report["rows"][0]["cells"]["triton"]["status"] == "ok"  # the one DeepSeek backend deterministic allows here
    assert "deterministic.deepseek-backend" in report["rows"][0]["cells"]["flashinfer"]["text"]
    code, out, _ = run([*argv, "--tp", "two"], capsys)
    assert code == 2 and json.loads(out)["errors"][0]["where"] == "--tp-size"


def test_lint_prints_json(capsys):
    code, out, _ = run(["lint", "--format", "json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["findings"] == [] and report["rules"] > 200 and report["invariants"] > 10


def test_gate_narrows_the_json_to_that_gate(capsys):
    gemma = ["explain", "--model", str(MODELS / "gemma-3-27b-it.json"), "--gpu", "sm90", "--format", "json"]
    code, out, _ = run([*gemma, "--attention-backend", "flashinfer", "--gate", "common.use_window"], capsys)
    report = json.loads(out)
    assert code == 0 and report["gates"] == {} and report["layers"]["sliding_window"]["common.use_window"]["value"]
    assert all(list(table) == ["common.use_window"] for table in report["layers"].values())
    code, out, _ = run([*gemma, "--gate", "common.use_windw"], capsys)
    assert code == 2 and "did you mean 'common.use_window'" in json.loads(out)["errors"][0]["message"]
