"""The CLI through typer's test runner, on real configs."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from attngate.cli import app
from tests.support.helpers import MODELS

runner = CliRunner(env={"COLUMNS": "240"})
EMBED = [
    "--is-embedding",
    "--chunked-prefill-size",
    "-1",
    "--disable-radix-cache",
    "--attention-backend",
    "fa3",
    "--gpu",
    "sm90",
]


def explain(*args: str):
    return runner.invoke(app, ["explain", *args])


def test_qwen3_embedding_json_skip_kv_cache_true():
    res = explain("--model", str(MODELS / "Qwen3-Embedding-8B.json"), *EMBED, "--format", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    gate = out["gates"]["fa.skip_kv_cache"]
    assert gate["value"] is True and gate["origin"] == "fa.skip-kv-cache-for-embedding"
    assert gate["facts"] == {
        "prefill_backend": "fa3",
        "decode_backend": "fa3",
        "is_embedding": True,
        "chunked_prefill_size": -1,
        "disable_radix_cache": True,
        "use_mla": False,
        "has_cross_attention": False,
    }
    assert set(out) >= {"plan", "server_args", "gates", "modes", "adjustments", "warnings", "errors"}
    assert out["plan"]["prefill_backend"] == "fa3" and len(out["plan"]["fingerprint"]) == 64
    assert out["modes"]["extend"]["fa.kv_extent"]["value"] == "none"
    for name in [
        "fa.precompute_scheduler_metadata",
        "fa.num_splits",
        "flashinfer.prefill_fixed_split_size",
        "flashinfer.decode_fixed_split_size",
        "flashinfer.cuda_graph_disable_split_kv",
        "flashinfer.decode_use_tensor_cores",
        "flashinfer.use_ragged_prefill",
        "flashinfer.wrapper_dispatch",
    ]:
        assert name in out["gates"]


def test_deepseek_json_skip_kv_cache_false_names_use_mla():
    res = explain(
        "--model",
        str(MODELS / "DeepSeek-V2-Lite.json"),
        *EMBED,
        "--format",
        "json",
        "--kernels",
        "flashinfer,flash_attn.cute,flash_attn_interface",
    )
    assert res.exit_code == 0, res.output
    gate = json.loads(res.stdout)["gates"]["fa.skip_kv_cache"]
    assert gate["value"] is False and gate["origin"] == "default" and gate["facts"]["use_mla"] is True
    assert gate["candidates"] == [{"rule": "fa.skip-kv-cache-for-embedding", "failed": ["not use_mla"]}]


def test_fa3_mla_without_flash_attn_interface_is_refused_with_what_would_work():
    own = ("--kernels", "attngate")  # attngate's own install: no FA3 (stock SGLang brings sgl_kernel's)
    res = explain("--model", str(MODELS / "DeepSeek-V2-Lite.json"), *EMBED, *own, "--format", "json")
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    assert [e["rule"] for e in report["errors"]] == ["fa.mla-needs-absorbed-kernel"]
    runs = [backend for backend, rules in report["candidates"].items() if not rules]  # only what would run
    assert runs and "flashinfer" in runs and "fa3" not in runs and "fa4" not in runs
    table = explain("--model", str(MODELS / "DeepSeek-V2-Lite.json"), *EMBED, *own)
    assert "candidate backends (--attention-backend, ServerArgs.attention_backend)" in table.output
    assert " ".join(table.output.split()).count("runs this") == len(runs)


def test_kernels_flag_names_unknown_providers():
    res = explain(
        "--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm90", "--kernels", "flashinfer,flash_atn.cute"
    )
    assert res.exit_code == 2 and "flash_atn.cute" in res.output and "flash_attn.cute" in res.output


def test_table_output_and_mode_filter():
    res = explain("--model", str(MODELS / "Qwen3-Embedding-8B.json"), *EMBED, "--all", "--mode", "extend")
    assert res.exit_code == 0, res.output
    assert "fa.skip-kv-cache-for-embedding" in res.stdout and "forward mode extend" in res.stdout
    assert "forward mode decode" not in res.stdout and "candidate backends" in res.stdout


def test_only_modes_that_occur_are_shown_and_asked_for():
    """An embedding server runs EXTEND only: no decode values on any screen, and --mode decode is a usage error
    naming the modes it runs; speculative decoding brings target_verify in."""
    res = explain("--model", str(MODELS / "Qwen3-Embedding-8B.json"), *EMBED, "--all")
    assert res.exit_code == 0 and "forward mode extend" in res.stdout
    assert not any(f"forward mode {m}" in res.stdout for m in ("decode", "target_verify", "draft_extend_v2", "idle"))
    res = explain("--model", str(MODELS / "Qwen3-Embedding-8B.json"), *EMBED, "--mode", "decode")
    assert res.exit_code == 2 and "does not occur" in res.output and "runs extend" in res.output
    llama = ["--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm90", "--format", "json"]
    assert json.loads(explain(*llama).stdout)["forward_modes"] == ["extend", "decode"]
    spec = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]
    modes = json.loads(explain(*llama, *spec, "--speculative-num-draft-tokens", "4").stdout)["forward_modes"]
    assert modes == ["extend", "decode", "target_verify", "draft_extend_v2"]


def test_invalid_configuration_exit_1_json_still_printed():
    res = explain(
        "--model",
        str(MODELS / "gpt-oss-20b.json"),
        "--attention-backend",
        "flashinfer",
        "--gpu",
        "sm90",
        "--format",
        "json",
    )
    assert res.exit_code == 1
    out = json.loads(res.stdout)
    assert out["plan"] is None and {"flashinfer.no-attention-sinks", "gpt-oss.backends"} <= {
        e["rule"] for e in out["errors"]
    }
    table = explain("--model", str(MODELS / "gpt-oss-20b.json"), "--attention-backend", "flashinfer", "--gpu", "sm90")
    assert table.exit_code == 1 and "flashinfer.no-attention-sinks" in table.stdout


def test_warnings_still_exit_0():
    res = explain(
        "--model",
        str(MODELS / "Llama-3.1-8B.json"),
        "--attention-backend",
        "fa3",
        "--kv-cache-dtype",
        "fp8_e5m2",
        "--gpu",
        "sm90",
        "--format",
        "json",
    )
    assert res.exit_code == 0
    assert any("fa3.fp8-e5m2-kv-falls-back-to-triton" in w for w in json.loads(res.stdout)["warnings"])


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "nope.json", "--gpu", "sm90"], "cannot read"),
        (["--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm95"], "unknown GPU 'sm95'"),
        (
            ["--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm90", "--attention-backnd", "fa3"],
            "did you mean '--attention-backend'",
        ),
        (["--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm90", "--mode", "prefill"], "not a forward mode"),
    ],
)
def test_bad_input_exit_2(args, needle):
    res = explain(*args)
    assert res.exit_code == 2
    assert needle in res.output


def test_bad_rules_file_exit_2(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text(
        "version: 1\nrules:\n  - {id: a, summary: s, why: w, source: s, when: is_embeding, set: {fa.skip_kv_cache: true}}\n"
    )
    res = explain("--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm90", "--rules", str(bad))
    assert res.exit_code == 2 and "did you mean 'is_embedding'" in res.output
    lint = runner.invoke(app, ["lint", str(bad)])
    assert lint.exit_code == 2 and f"{bad}:3:" in lint.output


def test_every_bad_input_reported_at_once(tmp_path):
    """Flags, model config, GPU and rules file all bad: one run names all four, not only the first."""
    res = explain("--model", str(tmp_path / "nope.json"), "--tp-size", "x", "--gpu", "sm99", "--rules", str(tmp_path))
    assert res.exit_code == 2
    for needle in ("--tp-size", "nope.json: cannot read", "--gpu: unknown GPU ", "is a directory"):
        assert needle in res.output, needle


def test_matrix_reports_every_bad_config(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    res = runner.invoke(
        app, ["matrix", str(tmp_path / "nope.json"), str(bad), str(MODELS / "Qwen3-8B.json"), "--gpu", "sm91"]
    )
    assert res.exit_code == 2
    for needle in ("nope.json: cannot read", f"{bad}:1:2: not JSON", "unknown GPU 'sm91'"):
        assert needle in res.output, needle


def test_diff_reports_both_bad_files(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("version: 1\nrules: 3\n")
    b.write_text("version: [\n")
    res = runner.invoke(app, ["diff", str(a), str(b)])
    assert res.exit_code == 2 and str(a) in res.output and str(b) in res.output


def test_args_file_with_flag_override(tmp_path):
    args = tmp_path / "args.yaml"
    args.write_text("attention_backend: flashinfer\nenable_deterministic_inference: true\n")
    res = explain(
        "--model",
        str(MODELS / "Llama-3.1-8B.json"),
        "--gpu",
        "sm90",
        "--args-file",
        str(args),
        "--attention-backend",
        "fa3",
        "--format",
        "json",
    )
    out = json.loads(res.stdout)
    assert out["plan"]["prefill_backend"] == "fa3" and out["gates"]["fa.num_splits"]["value"] == 1


def test_lint_shipped_rules_clean():
    res = runner.invoke(app, ["lint"])
    assert res.exit_code == 0 and "0 finding(s)" in res.output


def _lint(tmp_path, *rules: tuple[str, str, str]):
    """``attngate lint`` over a file of set rules, each ``(id, when, set)``."""
    f = tmp_path / "r.yaml"
    f.write_text(
        "version: 1\nrules:\n"
        + "".join(
            f"  - {{id: {i}, summary: s, why: w, source: s, when: {when}, set: {{{sets}}}}}\n"
            for i, when, sets in rules
        )
    )
    return runner.invoke(app, ["lint", str(f)])


def test_lint_finds_conflict_exit_1(tmp_path):
    res = _lint(
        tmp_path,
        ("a", "use_mla", "fa.num_splits: 1"),
        ("b", "is_embedding", "fa.num_splits: 2"),
        ("c", "use_mla and not use_mla", "fa.num_splits: 1"),
    )
    assert res.exit_code == 1
    assert "'a' and 'b' can both match" in res.output and "'c' can never match" in res.output


def test_lint_reads_derived_facts_by_their_definition(tmp_path):
    """A chain drafts speculative_num_steps + 1 tokens, and tp 4 over dp 2 divides: rules that contradict the
    definitions can never match; one that agrees with them can."""
    res = _lint(
        tmp_path,
        ("d", "speculative_num_steps == 3 and speculative_chain_draft_tokens == 7", "fa.num_splits: 1"),
        ("e", "tp_size == 4 and dp_size == 2 and not dp_divides_tp", "fa.num_splits: 1"),
        ("f", "speculative_num_steps == 3 and speculative_chain_draft_tokens == 4", "fa.num_splits: 1"),
    )
    assert res.exit_code == 1
    assert (
        "'d' can never match" in res.output
        and "'e' can never match" in res.output
        and "'f' can never" not in res.output
    )


def test_schema_and_matrix():
    schema = json.loads(runner.invoke(app, ["schema"]).stdout)
    assert "rules" in schema["properties"] and "RuleSpec" in schema["$defs"]
    res = runner.invoke(
        app, ["matrix", str(MODELS / "gpt-oss-20b.json"), str(MODELS / "DeepSeek-V2-Lite.json"), "--gpu", "sm90"]
    )
    assert res.exit_code == 0 and "flashinfer.no-attention-sinks" in res.stdout
    narrow = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["matrix", str(MODELS), "--gpu", "sm90"])
    assert narrow.exit_code == 0 and "…" not in narrow.output  # cells wrap at 80 columns, never cut short
    lines = narrow.output.splitlines()
    assert any("Llama-4-Scout-17B-16E-Instruct" in line for line in lines)  # model names whole, one row per model
    gpt_oss = next(line for line in lines if "gpt-oss-20b" in line)
    notes = {m[2]: m[1] for m in (re.match(r"(\d+) ([\w.-]+): ", line) for line in lines) if m}
    refused = {cell.split()[1] for cell in gpt_oss.split("│") if cell.strip().startswith("no ")}
    # a refusal names its notes: gpt-oss on FlashInfer through (at least) its sinks and gpt-oss's backend list
    assert any(
        {notes["flashinfer.no-attention-sinks"], notes["gpt-oss.backends"]} <= set(c.split(",")) for c in refused
    )
    assert len(lines) < 60


# ---- the explain view for people ---------------------------------------------------------------


@pytest.mark.parametrize("backend", [[], ["--attention-backend", "flashinfer"]], ids=["default", "flashinfer"])
@pytest.mark.parametrize("config", sorted(p.name for p in MODELS.glob("*.json")))
def test_explain_fits_one_screen_in_plain_text(config, backend):
    res = CliRunner(env={"COLUMNS": "80"}).invoke(
        app, ["explain", "--model", str(MODELS / config), "--gpu", "sm90", *backend]
    )
    if res.exit_code == 1:  # a configuration this backend refuses: the reasons, still one screen
        assert "invalid configuration" in res.output
    else:
        assert res.exit_code == 0, res.output
        assert "backends:" in res.output and "--gate NAME" in res.output
    lines = res.output.splitlines()
    assert len(lines) <= 60, res.output
    assert all(len(line) <= 80 for line in lines) and "…" not in res.output and "\x1b[" not in res.output
    assert res.output.count("adjustments:") <= 1


def test_explain_of_embedding_gemma_fits_one_screen_and_names_its_adjustments(tmp_path):
    """R33's adjustments each once, the FlashInfer refusal with its reason, and triton accepted (its verdict is what
    asking for it gives: no KV-pool adjustment for a non-FA backend)."""
    from tests.support.helpers import EMBEDDING_GEMMA

    config = tmp_path / "config.json"
    config.write_text(json.dumps(EMBEDDING_GEMMA))
    res = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["explain", "--model", str(config), "--gpu", "sm90"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert len(lines) <= 60 and all(len(line) <= 80 for line in lines)
    text = " ".join(res.output.split())
    assert "flashinfer rejected: flashinfer.no-bidirectional-window" in text and "bidirectional" in text
    assert any(line.endswith(" accepted") and "triton" in line for line in lines)
    for field in ("is_embedding", "disable_radix_cache", "chunked_prefill_size", "prefill_only_disable_kv_cache"):
        assert text.count(f"{field}: ") == 1, field


def test_explain_gate_gives_the_full_why_of_one_gate():
    args = ("--model", str(MODELS / "Mistral-7B-v0.1.json"), "--gpu", "sm90", "--attention-backend", "flashinfer")
    res = explain(*args, "--gate", "flashinfer.prefill_kernel_family")
    assert res.exit_code == 0
    assert "flashinfer.prefill_kernel_family [global] = 'fa2', from default" in res.output
    assert (
        "candidate flashinfer.prefill-fa3-on-hopper did not match, false: not flashinfer_prefill_custom_mask"
        in res.output
    )
    layer = explain(*args, "--gate", "common.use_window")
    assert "[layer kind sliding_window] = True" in layer.output and "[layer kind cross_attention]" not in layer.output
    typo = explain(*args, "--gate", "flashinfer.prefill_kernel_famly")
    assert typo.exit_code == 2 and "flashinfer.prefill_kernel_family" in typo.output


def test_explain_all_keeps_every_table_and_flags_lists_the_server_flags():
    res = explain("--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm90", "--all")
    assert res.exit_code == 0 and "layer kind full" in res.output and "forward mode decode" in res.output
    assert "layer kind encoder_only" not in res.output and "forward mode target_verify" not in res.output
    # in a pipe at 80 columns: plain lines, wrapped and never cut, every gate name whole with its full why
    narrow = CliRunner(env={"COLUMNS": "80"}).invoke(
        app,
        [
            "explain",
            "--model",
            str(MODELS / "DeepSeek-V2-Lite.json"),
            "--gpu",
            "sm100",
            "--attention-backend",
            "fa4",
            "--all",
        ],
    )
    assert narrow.exit_code == 0 and "…" not in narrow.output and "\x1b[" not in narrow.output
    assert all(len(line) <= 80 for line in narrow.output.splitlines())
    assert "  fa.precompute_scheduler_metadata = False, from fa.fa4-no-scheduler-precompute" in narrow.output
    assert "candidate fa.fa4-sm90-single-split did not match, false: is_hopper" in " ".join(narrow.output.split())
    llama = ["explain", "--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm90", "--mode", "decode"]
    only_decode = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*llama, "--all"])
    assert "forward mode decode:" in only_decode.output and "forward mode extend:" not in only_decode.output
    screen = CliRunner(env={"COLUMNS": "80"}).invoke(app, llama)  # --mode filters the default screen too
    assert len(screen.output.splitlines()) <= 60 and "common.capture_cuda_graph: decode = True" in screen.output
    flags = runner.invoke(app, ["flags"])
    assert "--page-size  (" in flags.output and "--enable-deterministic-inference" in flags.output
    assert "attngate flags" in runner.invoke(app, ["explain", "--help"]).output


def test_explain_shows_where_sglang_differs_on_purpose():
    # SGLang 0.5.23 picks the default backend before it fills EAGLE's parameters (issue 36554); attngate after
    res = explain("--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm90", "--speculative-algorithm", "EAGLE")
    assert res.exit_code == 0, res.output
    assert "differs from SGLang 0.5.23 on purpose" in res.stdout
    assert (
        "sglang.default-backend-before-speculative-params (attention_backend, page_size, sglang_refusal)" in res.stdout
    )
    out = json.loads(
        explain(
            "--model",
            str(MODELS / "Llama-3.1-8B.json"),
            "--gpu",
            "sm100",
            "--attention-backend",
            "fa3",
            "--format",
            "json",
        ).stdout
    )
    assert out["plan"] is None
    assert [d["id"] for d in out["deviations"]] == ["sglang.registry-refusals-at-start-up"]
    assert out["deviations"][0]["fields"] == ["refusal"] and out["deviations"][0]["source"].startswith("sglang 0.5.23")
    plain = json.loads(
        explain("--model", str(MODELS / "Llama-3.1-8B.json"), "--gpu", "sm90", "--format", "json").stdout
    )
    assert plain["deviations"] == []


def test_conform_without_sglang_names_the_extra_and_the_install_command():
    try:  # the main CI venv has no SGLang (tests/integrations/sglang runs where it is)
        import sglang  # noqa: F401

        pytest.skip(
            "SGLang is installed in this environment, so its absence cannot be shown (the main CI venv has none)"
        )
    except ImportError:
        pass
    res = runner.invoke(app, ["conform", "--generate", str(MODELS), "--gpu", "sm90"])
    assert res.exit_code == 2, res.output
    assert "attngate[sglang]" in res.output and "pip install --no-deps sglang==0.5.23" in res.output
    bad = runner.invoke(app, ["conform"])
    assert bad.exit_code == 2 and "give exactly one of them" in bad.output


def test_lint_without_z3_names_the_extra_to_install(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "z3" else find_spec(name, *a))
    res = CliRunner().invoke(app, ["lint"])
    assert res.exit_code == 2 and "needs z3-solver" in res.output and "attngate[analysis]" in res.output


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"attngate {version('attngate')}"
