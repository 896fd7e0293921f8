"""trtllm_mha on SM120 against SGLang 0.5.23 (runs where the sglang extra is installed): prefill runs there (FMHAv2,
sglang PR 31959) except over an fp8_e4m3 cache, which both refuse (trtllm-mha.sm120-prefill-fp8-kv); a decode-only
trtllm_mha keeps the fp8 cache; SM100's trtllm-gen prefill takes it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "sglang.srt.server_args", reason="the sglang extra is not installed (.ci/run gives it its own venv)"
)

from attngate import load_rules  # noqa: E402
from attngate.integrations.sglang.cases import Case  # noqa: E402
from attngate.integrations.sglang.conform import run_cases  # noqa: E402

QWEN3 = Path(__file__).parents[3] / "examples" / "models" / "Qwen3-8B.json"
FP8 = {"kv_cache_dtype": "fp8_e4m3"}


@pytest.mark.parametrize(
    ("gpu", "args", "verdict"),
    [
        ("sm120", {"attention_backend": "trtllm_mha"} | FP8, "both refuse"),
        ("sm120", {"prefill_attention_backend": "flashinfer", "decode_attention_backend": "trtllm_mha"} | FP8, "agree"),
        ("sm120", {"attention_backend": "trtllm_mha"}, "agree"),
        ("sm100", {"attention_backend": "trtllm_mha"} | FP8, "agree"),
    ],
)
def test_trtllm_mha_prefill_on_sm120_follows_sglang(gpu, args, verdict):
    (result,) = run_cases([Case(f"qwen3/{gpu}", QWEN3, gpu, args)], load_rules(), jobs=1)
    assert result.verdict.value == verdict, result.to_json()
