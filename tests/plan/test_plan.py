"""The Plan: frozen, JSON round trip, stable fingerprint across processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from attngate import Plan, Platform, ServerArgs, resolve
from attngate.errors import PlanLoadError
from tests.support.helpers import ROOT, model, resolve_flags

# gemma-2 (window, soft-cap) on FlashInfer as attngate's own backends run it (runs_sglang false): SGLang's FlashInfer
# backend drops both (known.flashinfer-softcap-planned-uncapped, known.flashinfer-ragged-prefill-drops-window)
SCRIPT = """
from attngate import ModelFacts, Platform, ServerArgs, resolve
r = resolve(ServerArgs.from_flags("--attention-backend flashinfer --enable-deterministic-inference".split()),
            ModelFacts.from_hf_config("examples/models/gemma-2-9b.json"),
            Platform.from_name("sm90", has_flash_attn_interface=True, runs_sglang=False))
print(r.plan.fingerprint)
"""


def test_fingerprint_identical_across_processes():
    prints = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        )
        prints.add(out.stdout.strip())
    in_process = resolve(
        ServerArgs.from_flags("--attention-backend flashinfer --enable-deterministic-inference".split()),
        model("gemma-2-9b"),
        Platform.from_name("sm90", has_flash_attn_interface=True, runs_sglang=False),
    ).plan.fingerprint
    assert prints == {in_process}


def test_json_round_trip_and_tamper_detection():
    plan = resolve_flags("--attention-backend fa3", "gpt-oss-20b").plan
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.fingerprint == plan.fingerprint
    tampered = re.sub(r'"num_splits": \d+', '"num_splits": 3', plan.to_json())
    assert tampered != plan.to_json()
    with pytest.raises(PlanLoadError, match="does not match"):
        Plan.from_json(tampered)
    with pytest.raises(PlanLoadError, match="prefill_backend"):
        Plan.from_json('{"decode_backend": "fa3"}')


def test_a_plan_outside_its_gates_domains_does_not_load():
    """Gate domains (page_size >= 1, split counts >= 0, workspace > 0, ...) hold for a plan loaded without a
    fingerprint too: every value outside one is named."""
    body = json.loads(resolve_flags("--attention-backend fa3", "Llama-3.1-8B").plan.to_json())
    del body["fingerprint"]
    body["common"]["page_size"], body["fa"]["num_splits"], body["flashinfer"]["workspace_size_mb"] = 0, -5, 0
    with pytest.raises(PlanLoadError) as err:
        Plan.from_json(json.dumps(body))
    text = str(err.value)
    assert "page_size" in text and "num_splits" in text and "workspace_size_mb" in text


def test_plan_is_frozen_and_fingerprint_tracks_content():
    a = resolve_flags("--attention-backend fa3", "Llama-3.1-8B").plan
    b = resolve_flags("--attention-backend fa3 --enable-deterministic-inference", "Llama-3.1-8B").plan
    assert a.fingerprint != b.fingerprint
    with pytest.raises(Exception):
        a.fa.num_splits = 4  # type: ignore[misc]


def test_resolve_and_explain_never_import_z3():
    code = (
        "import sys; from typer.testing import CliRunner; from attngate.cli import app; "
        "r = CliRunner().invoke(app, ['explain', '--model', 'examples/models/Llama-3.1-8B.json', '--gpu', 'sm90']); "
        "assert r.exit_code == 0, r.output; assert 'z3' not in sys.modules, 'z3 imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_core_never_imports_torch():
    code = "import sys, attngate, attngate.cli, attngate.analysis.lint; import attngate.cli.render; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
