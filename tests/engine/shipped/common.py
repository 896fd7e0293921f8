"""Helpers the shipped-rule tests share: the FlashInfer known failures SGLang plans around, and model facts for
architectures outside examples/models."""

from __future__ import annotations

import json

from attngate import ModelFacts
from tests.support.helpers import MODELS

#: SGLang's FlashInfer backend gives the soft-cap and the ragged window per call, not at plan time (sglang issue 33915)
SGLANG_FLASHINFER_PLAN_TIME = [
    "known.flashinfer-softcap-planned-uncapped",
    "known.flashinfer-ragged-prefill-drops-window",
]


def as_architecture(architecture: str, model_type: str, **config) -> ModelFacts:
    """Llama-3.1-8B's attention under another architecture's name, with the layer layout its Hub config gives."""
    raw = json.loads((MODELS / "Llama-3.1-8B.json").read_text())
    raw.update(architectures=[architecture], model_type=model_type, **config)
    return ModelFacts.from_hf_dict(raw)


#: Hub config layouts of OLMo-3, Qwen3-Next, LFM2 and EXAONE-4, for :func:`as_architecture`.
OLMO3 = dict(
    sliding_window=4096,
    layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"] * 25,
)
QWEN3_NEXT = dict(
    layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"] * 25
)
LFM2 = dict(layer_types=["conv", "conv", "full_attention"] + ["conv"] * 29)
EXAONE4 = dict(sliding_window=4096, sliding_window_pattern="LLLG")
