"""The conformance cases of deviation_cases.json against SGLang 0.5.23 (runs where the sglang extra is installed):
each is named ``deviation/<id>/...`` after a deviation the generated corpus cannot reach, and SGLang and attngate
must differ there exactly as that deviation declares. verify() names the deviation that excused a difference.
tests/rules/test_deviation_checks.py holds every shipped deviation to some case, attngate's side only."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

pytest.importorskip(
    "sglang.srt.server_args", reason="the sglang extra is not installed (.ci/run gives it its own venv)"
)

from attngate import load_rules  # noqa: E402
from attngate.integrations.sglang.cases import load_cases  # noqa: E402
from attngate.integrations.sglang.conform import run_cases  # noqa: E402
from attngate.integrations.sglang.fields import sglang_field_names  # noqa: E402
from attngate.integrations.sglang.verify import compare_with_sglang, verify  # noqa: E402

HERE = Path(__file__).parent
MODELS = HERE.parents[2] / "examples" / "models"


def test_each_deviation_case_differs_as_its_deviation_declares():
    cases = load_cases(HERE / "deviation_cases.json", sglang_field_names())
    results = run_cases(cases, load_rules(), jobs=2)
    assert len(results) == len(cases) >= 2
    for result in results:
        deviation = result.name.split("/")[1]
        assert result.verdict.value == "declared deviation", (result.name, result.to_json())
        assert all(deviation in ids for ids in result.declared.values()), (result.name, result.declared)


def test_verify_names_the_deviation_that_excused_a_difference(tmp_path: Path, caplog):
    from sglang.srt.server_args import ServerArgs

    from attngate.integrations.sglang.device import fake_gpu, preload

    shutil.copyfile(MODELS / "Llama-3.1-8B.json", tmp_path / "config.json")
    preload()
    record = ServerArgs(
        model_path=str(tmp_path), speculative_algorithm="EAGLE", speculative_draft_model_path=str(tmp_path)
    )
    with fake_gpu("sm90"):
        record.resolve_once()
    with caplog.at_level(logging.INFO, logger="attngate.sglang"):
        assert verify(record, gpu="sm90") is not None
    result = compare_with_sglang(record, gpu="sm90")
    assert result.differences and set(result.declared) == set(result.differences)
    ids = {i for found in result.declared.values() for i in found}
    assert ids == {"sglang.default-backend-before-speculative-params"}
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("declared by deviation sglang.default-backend-before-speculative-params (" in m for m in logged), logged
