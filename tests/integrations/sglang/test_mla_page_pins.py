"""MLA backends' page-size pins against SGLang 0.5.23 (runs where the sglang extra is installed): flashmla and
trtllm_mla pin pages as the attention or the decode backend only, never as a prefill-only backend (SGLang's FlashMLA
and TRT-LLM MLA extend run FlashInfer MLA's, which takes any page size); a FlashInfer MLA draft with topk > 1 is a
start-up refusal (its multi-step draft backend's constructor), declared as one. Every phase split of each backend,
on the GPU that runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "sglang.srt.server_args", reason="the sglang extra is not installed (.ci/run gives it its own venv)"
)

from attngate import load_rules  # noqa: E402
from attngate.integrations.sglang.cases import Case  # noqa: E402
from attngate.integrations.sglang.conform import run_cases  # noqa: E402

DEEPSEEK = Path(__file__).parents[3] / "examples" / "models" / "DeepSeek-V3.json"
SPLITS = {
    "attention": {"attention_backend": "{b}"},
    "prefill-only": {"prefill_attention_backend": "{b}"},
    "decode-only": {"decode_attention_backend": "{b}"},
    "prefill-flashinfer": {"prefill_attention_backend": "flashinfer", "decode_attention_backend": "{b}"},
}


def _cases() -> list[Case]:
    cases = []
    for backend, gpu in (("flashmla", "sm90"), ("trtllm_mla", "sm100")):
        for split, args in SPLITS.items():
            given = {k: v.format(b=backend) for k, v in args.items()} | {"tp_size": 8}
            cases.append(Case(f"{backend}/{split}", DEEPSEEK, gpu, given))
    return cases


def test_mla_page_pins_follow_sglang_in_every_phase_split():
    results = run_cases(_cases(), load_rules(), jobs=2)
    for result in results:
        assert result.verdict.value == "agree", (result.name, result.to_json())
        assert result.sglang is not None, result.name


def test_a_flashinfer_mla_draft_with_topk_above_one_is_a_declared_start_up_refusal():
    args = {"attention_backend": "flashinfer", "speculative_algorithm": "EAGLE", "speculative_eagle_topk": 4}
    args |= {"speculative_num_steps": 3, "speculative_num_draft_tokens": 8, "tp_size": 8}
    (result,) = run_cases([Case("flashinfer-mla-draft-topk4", DEEPSEEK, "sm90", args)], load_rules(), jobs=1)
    assert result.verdict.value == "declared deviation", result.to_json()
    assert result.declared == {"refusal": ["sglang.registry-refusals-at-start-up"]}
