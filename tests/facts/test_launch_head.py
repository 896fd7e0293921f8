"""A pasted launch line split as SGLang 0.5.23's entry points split it (attngate.facts.launch_head): the program is the
first launcher word before any flag, never a value; its environment variables are listed, never dropped; --config as
SGLang's ConfigArgumentMerger takes it; argparse's choices; --model and --model-path compared resolved; a hub id that
is neither cached nor reachable fails within 2 s (issues 51 and 53)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from attngate.cli import app
from attngate.facts.hub import same_model
from attngate.facts.launch import parse_launch_line
from attngate.facts.launch_head import split_command
from attngate.facts.server_args import ServerArgs
from tests.support.helpers import MODELS, ROOT


def read(line: str):
    return parse_launch_line(line.split(), ServerArgs.model_fields)


@pytest.mark.parametrize(
    "line",
    [
        "--tp 2 --tokenizer-path x/launch_server.py --attention-backend triton",
        "--tokenizer-path=x/launch_server.py --tp 2 --attention-backend triton",  # a first flag with its value
        "--attention-backend triton --tokenizer-path /opt/sglang/launch_server.py --tp 2",
        "--served-model-name sglang --attention-backend triton --tp 2",
        "python -m sglang.launch_server --tp 2 --tokenizer-path ./launch_server.py --attention-backend triton",
        "sglang serve MODEL --tp 2 --tokenizer-path launch_server.py --attention-backend triton",
        "FOO=/x/launch_server.py python3 -m sglang.launch_server --tp 2 --attention-backend triton",
    ],
)
def test_a_value_is_never_taken_for_the_program(line):
    read_line = read(line)
    assert read_line.values == {"tp_size": "2", "attention_backend": "triton"}, read_line
    assert not read_line.problems


@pytest.mark.parametrize(
    "line, program",
    [
        ("python -m sglang.launch_server --tp 2", "python -m sglang.launch_server"),
        ("/usr/bin/python3.11 -u -X dev -m sglang.launch_server --tp 2", "python3.11 -m sglang.launch_server"),
        ("python3 -msglang.launch_server --tp 2", "python3 -m sglang.launch_server"),
        (
            "python3 /opt/sglang/python/sglang/launch_server.py --tp 2",
            "python3 /opt/sglang/python/sglang/launch_server.py",
        ),
        ("./launch_server.py --tp 2", "./launch_server.py"),
        ("env -i -u HOME A=1 nohup python -m sglang.launch_server --tp 2", "python -m sglang.launch_server"),
        ("uv run python -m sglang.launch_server --tp 2", "python -m sglang.launch_server"),
        ("python -m sglang.cli.main serve --tp 2", "python -m sglang.cli.main serve"),
        ("--tp 2", None),
    ],
)
def test_launcher_spellings(line, program):
    head = split_command(line.split())
    assert (head.program, head.args, head.problems) == (program, ["--tp", "2"], [])


def test_sglang_serve_takes_out_model_type_and_its_positional_model():
    head = split_command("/usr/local/bin/sglang serve --model-type llm org/m --tp 2".split())
    assert head.args == ["--model-path", "org/m", "--tp", "2"] and not head.problems
    diffusion = split_command("sglang serve org/m --model-type=diffusion".split())
    assert diffusion.args == ["--model-path", "org/m"] and [p.where for p in diffusion.problems] == ["--model-type"]
    assert read("sglang serve org/m --model-type").problems  # SGLang: 'Error: --model-type requires a value.'


def test_no_launcher_before_the_first_flag_leaves_the_words_as_arguments():
    line = read("X=1 nohup --tp 2")  # a wrapper with options of its own is not read past: loud, never silent
    assert line.env == {"X": "1"} and [p.where for p in line.problems] == ["nohup"]


def test_environment_variables_are_listed_and_the_attention_ones_warned_about():
    line = read(
        "SGLANG_ENABLE_SPEC_V2=1 SGLANG_FLASHINFER_USE_PAGED=1 CUDA_VISIBLE_DEVICES=0 SGLANG_GRPC_PORT=1 "
        "env SGLANG_RAGGED_VERIFY_MODE=x python -m sglang.launch_server --tp 2 --port 1"
    )
    assert line.not_read == [
        "SGLANG_ENABLE_SPEC_V2",
        "SGLANG_FLASHINFER_USE_PAGED",
        "CUDA_VISIBLE_DEVICES",
        "SGLANG_GRPC_PORT",
        "SGLANG_RAGGED_VERIFY_MODE",
        "--port",
    ]
    warned = {p.where.split()[2].split("=")[0]: p.message for p in line.warnings}
    assert set(warned) == {"SGLANG_ENABLE_SPEC_V2", "SGLANG_FLASHINFER_USE_PAGED", "SGLANG_RAGGED_VERIFY_MODE"}
    assert "reads no such environment variable" in warned["SGLANG_ENABLE_SPEC_V2"]  # not a variable of 0.5.23
    assert (
        "flashinfer_backend.py" in warned["SGLANG_FLASHINFER_USE_PAGED"]
        and "no rule" in warned["SGLANG_FLASHINFER_USE_PAGED"]
    )


def test_explain_lists_the_environment_and_warns(monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = "SGLANG_FLASHINFER_USE_PAGED=1 python -m sglang.launch_server --model-path".split()
    res = CliRunner().invoke(
        app, ["explain", "--gpu", "H100", "--format", "json", "--", *argv, "examples/models/Llama-3.1-8B.json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["not_read"] == ["SGLANG_FLASHINFER_USE_PAGED"]
    assert "warning: environment variable SGLANG_FLASHINFER_USE_PAGED=1" in res.stderr


def test_config_is_merged_as_sglang_merges_it(tmp_path):
    config = tmp_path / "s.yaml"
    config.write_text("attention-backend: flashinfer\ntp: 2\n")
    assert read(f"--config {config} --attention-backend triton").values == {
        "attention_backend": "triton",
        "tp_size": "2",
    }
    assert read(f"--attention-backend triton --config {config}").values["attention_backend"] == "triton"  # CLI wins
    twice = read(f"--config {config} --config {config}")
    assert [p.where for p in twice.problems] == ["--config"] and "one config file" in twice.problems[0].message
    assert [p.where for p in read("--tp 2 --config").problems] == ["--config"]
    for spelling in (f"--config={config}", f"--conf {config}"):  # SGLang parses these and never opens the file
        line = read(f"{spelling} --tp 4")
        assert line.values == {"tp_size": "4"} and line.not_read == ["--config"] and not line.problems
        assert "never read" in line.warnings[0].message
    switch = tmp_path / "switch.yaml"
    switch.write_text("enable-tf32-matmul: true\n")
    assert "does not take --enable-tf32-matmul" in read(f"--config {switch}").problems[0].message


def test_choices_are_sglangs():
    assert read("--attention-backend qsa --decode-attention-backend llada2_cfg_flashinfer").values == {
        "attention_backend": "qsa",
        "decode_attention_backend": "llada2_cfg_flashinfer",
    }
    refused = read("--attention-backend cutlass_mla --kv-cache-dtype fp4_e2m1 --sampling-backend intel_xpu")
    assert [p.where for p in refused.problems] == ["--attention-backend", "--kv-cache-dtype"]
    assert refused.problems[0].message.startswith("invalid choice: 'cutlass_mla' (choose from triton, ")
    assert "no longer offers it" in refused.problems[0].message and refused.values == {"sampling_backend": "intel_xpu"}
    assert [p.where for p in read("--log-requests-level 2 --reasoning-parser nope").problems] == ["--reasoning-parser"]
    unmodelled = read("--speculative-algorithm UNO")
    assert unmodelled.values == {} and "do not model" in unmodelled.problems[0].message


def test_explain_runs_a_backend_sglang_offers_and_attngate_has_no_kernels_for(monkeypatch):
    monkeypatch.chdir(ROOT)
    res = CliRunner().invoke(
        app,
        ["explain", "--gpu", "H100", "--model", "examples/models/Llama-3.1-8B.json", "--attention-backend", "qsa"],
    )
    assert res.exit_code in (0, 1) and res.exception is None or isinstance(res.exception, SystemExit), res.output


def test_model_and_model_path_are_compared_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(MODELS)
    assert same_model("Llama-3.1-8B.json", f"../models/{'Llama-3.1-8B.json'}")
    assert same_model(str(MODELS / "Llama-3.1-8B.json"), "./Llama-3.1-8B.json")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text((MODELS / "Llama-3.1-8B.json").read_text())
    assert same_model(tmp_path / "m", str(tmp_path / "m" / ".." / "m" / "config.json"))  # a folder and its config
    assert same_model("org/name", "org/name") and not same_model("org/name", "org/other")
    assert not same_model("org/name", "Llama-3.1-8B.json")
    runner = CliRunner()
    line = ["--", "python", "-m", "sglang.launch_server", "--model-path", "../models/Llama-3.1-8B.json"]
    res = runner.invoke(app, ["explain", "--gpu", "H100", "--model", "Llama-3.1-8B.json", *line])
    assert res.exit_code == 0, res.output
    other = runner.invoke(app, ["explain", "--gpu", "H100", "--model", "Qwen3-8B.json", *line])
    assert other.exit_code == 2 and "name two models" in other.output


_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from typer.testing import CliRunner
    from attngate.cli import app
    from attngate.facts.hub import config_path
    start = time.perf_counter()
    try:
        config_path("org/not-cached")
        error = None
    except Exception as err:
        error = str(err)
    took = time.perf_counter() - start
    start = time.perf_counter()
    res = CliRunner().invoke(app, ["explain", "--gpu", "H100", "--model", "org/not-cached"])
    print(json.dumps({"took": took, "error": error, "cli_took": time.perf_counter() - start,
                      "cli_exit": res.exit_code, "cli_output": res.output}))
    """
)


def _offline_child(endpoint: str, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.pop("HF_HUB_ETAG_TIMEOUT", None)
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), COLUMNS="200", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_an_uncached_hub_id_with_the_hub_unreachable_fails_within_2_s(tmp_path):
    result = _offline_child("http://127.0.0.1:9", tmp_path)  # nothing listens: connection refused
    assert result["took"] < 2 and result["cli_took"] < 2, result
    assert "org/not-cached" in result["error"] and "could not be reached" in result["error"]
    assert result["cli_exit"] == 2 and "could not be reached" in result["cli_output"]
    assert "Retrying" not in result["cli_output"]


def test_a_hub_that_never_answers_fails_within_2_s(tmp_path):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        result = _offline_child(f"http://127.0.0.1:{silent.getsockname()[1]}", tmp_path)
    assert result["took"] < 2 and result["cli_took"] < 2, result
    assert "could not be reached in one attempt" in result["error"]
