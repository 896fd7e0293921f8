"""An SGLang launch line read as SGLang 0.5.23 reads it (attngate.facts.launch): aliases, prefixes, --no-X, --config
YAML, a pasted command head, renamed fields, flags no rule reads, and --model-path as a hub id from the hub cache."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attngate.cli import app
from attngate.errors import ServerArgsError
from attngate.facts.launch import flag_catalogue, parse_launch_line
from attngate.facts.server_args import ServerArgs
from tests.support.helpers import MODELS, cache_hub_config


def read(line: str):
    return parse_launch_line(line.split(), ServerArgs.model_fields)


def test_aliases_and_unambiguous_prefixes_read_as_sglang_reads_them():
    line = read("--tp 2 --tensor-par 4 --ep 2 --attention-backend fa3 --page 16")
    assert line.values == {"tp_size": "4", "attention_backend": "fa3"} and "--ep-size" in line.not_read
    assert [str(p) for p in line.problems] == [
        "--page: ambiguous abbreviation: could be --page-size, --paged-experts-num-resident"
    ]
    assert [p.where for p in line.warnings] == ["--tensor-par"]  # given twice with different values: the last wins


@pytest.mark.parametrize("value", ["--tp 4", "-x y", "- a"])
def test_a_value_holding_a_space_is_a_value_whatever_it_starts_with(value):
    """argparse never takes a word with a space for an option: SGLang reads --served-model-name "--tp 4"."""
    line = parse_launch_line(["--served-model-name", value, "--tp", "2"], ServerArgs.model_fields)
    assert not line.problems and line.values == {"tp_size": "2"} and "--served-model-name" in line.not_read
    line = parse_launch_line(["--served-model-name", "--tp=4"], ServerArgs.model_fields)  # a flag and its value
    assert [str(p) for p in line.problems] == ["--served-model-name: expects a value"]
    assert line.values == {"tp_size": "4"}


def test_flags_after_a_double_dash_are_refused_as_sglang_refuses_them():
    """argparse ends the options at '--': SGLang says "unrecognized arguments: -- --tp 4" (it was read as an ambiguous
    abbreviation of every flag, and the --tp after it as the last --tp)."""
    line = read("--model-path m --tp 2 -- --tp 4")
    assert [str(p) for p in line.problems] == [
        "--: SGLang's parser reads no flag after '--' and refuses the 2 word(s) after it as unrecognized arguments"
    ]
    assert line.values == {"tp_size": "2"} and not line.warnings


def test_a_pasted_command_with_flags_no_rule_reads():
    line = read(
        "CUDA_VISIBLE_DEVICES=0,1 python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct "
        "--tp 2 --mem-fraction-static 0.85 --port 30000 --host 0.0.0.0 --port 30001 --chunked-prefill-size -1"
    )
    assert line.model_path == "meta-llama/Llama-3.1-8B-Instruct" and not line.problems
    assert line.values == {"tp_size": "2", "chunked_prefill_size": "-1"}  # -1 is a value, as in argparse
    # each once, in order; the environment variable is listed too (no rule reads any), never dropped
    assert line.not_read == ["CUDA_VISIBLE_DEVICES", "--mem-fraction-static", "--port", "--host"]
    assert line.program == "python3 -m sglang.launch_server" and line.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    serve = read(
        "sglang serve Qwen/Qwen3-8B --enable-torch-compile --cuda-graph-bs-decode 1 2 4 --no-enable-tf32-matmul"
    )
    assert serve.model_path == "Qwen/Qwen3-8B" and serve.values == {"enable_torch_compile": True}
    assert not serve.problems and serve.not_read == ["--cuda-graph-bs-decode", "--enable-tf32-matmul"]


def test_renamed_fields_follow_sglangs_hooks():
    assert read("--attn-dp-size 4 --tp 4").values == {"tp_size": "4", "dp_size": 4, "enable_dp_attention": True}
    old = read("--enable-dp-attention --dp 2").values
    assert old["enable_dp_attention"] is True and old["dp_size"] == 2
    assert read("--dp-size 2").values == {"dp_size": 2}  # replicas, not attention DP
    assert read("--disable-decode-cuda-graph").values["disable_cuda_graph"] is True
    graphs = read("--disable-decode-cuda-graph --cuda-graph-backend-decode full").values  # the backend flag wins
    assert graphs["disable_cuda_graph"] is False
    config = parse_launch_line(
        ["--cuda-graph-config", json.dumps({"decode": {"backend": "disabled"}})], ServerArgs.model_fields
    )
    assert config.values["disable_cuda_graph"] is True
    bad = read("--attn-dp-size two")
    assert [p.where for p in bad.problems] == ["--attn-dp-size"]


def test_every_problem_at_once_with_suggestions():
    line = read("--attention-backnd fa3 x --page-size --xyz 1 --is-embedding=yes")
    messages = [str(p) for p in line.problems]
    assert (
        "--attention-backnd: unknown SGLang server argument\n    help: did you mean '--attention-backend'?" in messages
    )
    assert "x: unexpected argument: server arguments are --flag [value]" in messages
    assert "--page-size: expects a value" in messages and any(m.startswith("--is-embedding") for m in messages)
    assert len(messages) == 5  # --xyz's value is not reported again as a stray argument
    with pytest.raises(ServerArgsError) as err:
        ServerArgs.from_flags("--attention-backnd fa3 --tp two".split())
    assert {p.where for p in err.value.problems} == {"--attention-backnd", "--tp-size"}


def test_config_yaml_merges_under_the_command_line(tmp_path):
    """ConfigArgumentMerger: each key becomes --KEY as written (tp, an alias, works; tp_size does not, as in SGLang,
    whose parser does not know --tp_size), the file's flags before the command line's own."""
    config = tmp_path / "server.yaml"
    config.write_text(
        "tp: 2\ntp-size: 4\nattention-backend: flashinfer\nenable-torch-compile: true\n"
        "disable-radix-cache: false\ncuda-graph-bs-decode: [1, 2]\nmem-fraction-static: 0.8\n"
    )
    line = read(f"--config {config} --attention-backend fa3")
    assert line.values == {"tp_size": "4", "attention_backend": "fa3", "enable_torch_compile": True}
    assert line.not_read == ["--cuda-graph-bs-decode", "--mem-fraction-static"] and not line.problems
    assert [p.where.rsplit(": ", 1)[-1] for p in line.warnings] == ["tp-size", "--attention-backend"]
    under = tmp_path / "under.yaml"
    under.write_text("attention_backend: flashinfer\nenable_torch_compile: true\n")
    problems = read(f"--config {under}").problems
    assert [p.where.split(":")[0] + ": " + p.where.split(": ")[-1] for p in problems] == [
        f"{under}: attention_backend",
        f"{under}: enable_torch_compile",
    ]
    assert "write attention-backend" in problems[0].message
    bad = tmp_path / "server.yml"
    bad.write_text("enable-tf32-matmul: true\n- a list\n")
    assert read(f"--config {bad}").problems and read(f"--config {tmp_path / 'x.json'}").problems
    assert [p.where for p in read(f"--config {tmp_path / 'missing.yaml'}").problems] == [str(tmp_path / "missing.yaml")]


def test_flags_lists_spellings_and_allowed_values():
    rows = {row["field"]: row for row in flag_catalogue(ServerArgs.model_fields)}
    assert rows["tp_size"]["flags"] == ["--tp-size", "--tensor-parallel-size"] and rows["tp_size"]["takes"] == "int"
    assert "--attn-dp-size" in rows["enable_dp_attention"]["flags"]
    assert (
        rows["kv_cache_dtype"]["takes"].startswith("one of auto, bf16") and rows["page_size"]["takes"] == "int or None"
    )
    out = json.loads(CliRunner().invoke(app, ["flags", "--format", "json"]).stdout)
    assert {row["field"] for row in out} == set(ServerArgs.model_fields)


def test_a_hub_id_resolves_from_the_cache_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache_hub_config(tmp_path, "meta-llama/Llama-3.1-8B-Instruct", (MODELS / "Llama-3.1-8B.json").read_text())
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    runner = CliRunner(env={"COLUMNS": "80"})
    res = runner.invoke(
        app,
        [
            "explain",
            "--gpu",
            "H100",
            "--",
            "python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--tp",
            "2",
            "--mem-fraction-static",
            "0.85",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "LlamaForCausalLM" in res.output and "not read by any rule: --mem-fraction-static" in res.output
    missing = runner.invoke(app, ["explain", "--gpu", "H100", "--model", "org/not-cached"])
    assert missing.exit_code == 2 and "org/not-cached" in missing.output and "HF_HUB_OFFLINE" in missing.output
