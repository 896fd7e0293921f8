"""explain and conform answer for one deployment: for every case of the generated conformance corpus, ``attngate
explain --gpu GPU`` (no --kernels) resolves the backends and page size that conform's attngate side resolves, or
refuses through the same rules. Both default to a stock SGLang install on the case's GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attngate import Platform, ServerArgs, load_rules, resolve
from attngate.cli import app
from attngate.errors import PlanError
from attngate.facts.model import ModelFacts
from attngate.integrations.sglang.cases import generate_cases

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted((ROOT / "examples" / "models").glob("*.json"))
runner = CliRunner(env={"COLUMNS": "240"})


def _flags(case) -> list[str]:
    """The case's SGLang arguments as a launch line (every generated value is a non-default one: a bool is True)."""
    flags = []
    for name, value in case.args.items():
        flag = "--" + name.replace("_", "-")
        assert value is not False, (case.name, name)
        flags += [flag] if value is True else [flag, str(case.model_config) if value == "{model}" else str(value)]
    return flags


def _conform_side(case, model: ModelFacts, rules) -> tuple:
    """What conform's attngate half resolves (attngate.integrations.sglang.conform: the case's kernels)."""
    try:
        args = ServerArgs.from_flags(_flags(case))
        r = resolve(args, model, Platform.from_name(case.gpu, kernels=case.kernels), rules)
    except PlanError as err:
        return ("refused", sorted({v.rule for v in err.violations if v.rule}))
    return (r.plan.prefill_backend, r.plan.decode_backend, r.server_args.page_size)


def _explain_side(case) -> tuple:
    line = ["--gpu", case.gpu, "--format", "json", "--", "python", "-m", "sglang.launch_server", "--model-path"]
    out = runner.invoke(app, ["explain", *line, str(case.model_config), *_flags(case)])
    report = json.loads(out.stdout)
    if out.exit_code == 1:
        return ("refused", sorted({e["rule"] for e in report["errors"] if e.get("rule")}))
    assert out.exit_code == 0, out.output
    assert report["platform"]["kernel_source"] == "sglang"
    plan = report["plan"]
    return (plan["prefill_backend"], plan["decode_backend"], report["server_args"]["page_size"])


def test_explain_and_conform_give_one_answer_for_every_corpus_case():
    rules = load_rules()
    cases = generate_cases(MODELS, ["sm80", "sm90", "sm100"], rules)
    models = {path: ModelFacts.from_hf_config(path) for path in MODELS}
    differ = [
        f"{case.name}: conform {mine}, explain {shown}"
        for case in cases
        if (mine := _conform_side(case, models[case.model_config], rules)) != (shown := _explain_side(case))
    ]
    assert len(cases) >= 2000
    assert not differ, "\n".join(differ[:20])


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ("H100", ("fa3", "fa3")),  # SGLang 0.5.23's MLA default on Hopper with sgl_kernel's FA3
        ("NVIDIA H100 80GB HBM3", ("fa3", "fa3")),  # nvidia-smi's name
        ("B200", ("trtllm_mla", "trtllm_mla")),
    ],
)
def test_a_pasted_sglang_line_is_answered_for_sglangs_kernels(gpu: str, expected: tuple[str, str]):
    line = ["--", "python3", "-m", "sglang.launch_server", "--model-path", "examples/models/DeepSeek-V3.json"]
    out = runner.invoke(app, ["explain", "--gpu", gpu, "--format", "json", *line, "--tp", "8"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert (report["plan"]["prefill_backend"], report["plan"]["decode_backend"]) == expected
    assert report["platform"]["kernel_source"] == "sglang"


def test_kernels_presets_and_the_header_name_the_set():
    args = ["explain", "--gpu", "sm90", "--model", "examples/models/DeepSeek-V3.json"]
    stock = runner.invoke(app, args)
    assert "kernels: flashinfer, flash_attn.cute, flash_attn_interface (stock SGLang" in stock.output
    own = runner.invoke(app, [*args, "--kernels", "attngate", "--format", "json"])
    report = json.loads(own.stdout)
    assert report["platform"] == {
        "gpu_arch": "sm90",
        "kernels": ["flashinfer", "flash_attn.cute"],
        "kernel_source": "given",
    }
    # without sgl_kernel's FA3, SGLang's MLA default on Hopper falls to flashinfer (rule default-backend.mla-hopper-without-fa3)
    assert report["plan"]["prefill_backend"] == "flashinfer"
