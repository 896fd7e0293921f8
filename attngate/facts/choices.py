"""SGLang's choice lists for attention-relevant server arguments, as ``Literal`` types: the values each fact may take
in the rule language and in attngate's ServerArgs.

Derived from SGLang 0.5.23 (its parser's choices, ``arg_groups.choices.DRAFT_ATTENTION_BACKEND_CHOICES``, the
``SpeculativeAlgorithm`` enum) by ``python -m attngate.integrations.sglang.tables --write``, which rewrites the
``Literal`` lists below (an existing name keeps its place, a new one goes after its predecessor in SGLang's list);
``tests/integrations/sglang/test_tables.py`` fails when they drift. Every name SGLang accepts is a valid input here,
except the ones in NOT_MODELLED; SGLANG_REFUSES names the ones the rule language keeps though SGLang's parser refuses
them (a launch line giving one is refused as SGLang refuses it). attngate ships backends for only some of them.
"""

from __future__ import annotations

from typing import Literal, get_args

# the GPU architectures are attngate.facts.gpus' table, not an SGLang choice list; named here too for the callers
# that import them from here (attngate.integrations.sglang)
from attngate.facts.gpus import GPU_ARCHS, GpuArch  # noqa: F401

#: The SGLang release whose argument resolution, choice lists and kernels rules.yaml models.
SGLANG_VERSION = "0.5.23"

AttentionBackendName = Literal[
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "nsa",
    "qsa",
    "dsv4",
    "compressed",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
    "llada2_cfg_flashinfer",
    "flashmla",
    "trtllm_mla",
    "cutedsl_mla",
    "tokenspeed_mla",
    "trtllm_mha",
    "hpc_ops",
    "minicpm_flashattn",
    "minicpm_flashinfer",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
]
DraftAttentionBackendName = Literal["flashinfer", "fa3", "fa4", "triton", "ascend", "trtllm_mha", "intel_xpu"]
KvCacheDtype = Literal[
    "auto",
    "bf16",
    "bfloat16",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp4_e2m1",
    "nvfp4",
    "fp4_mx_block16",
    "mxfp8",
]
ModelDtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
SpeculativeAlgorithm = Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"]
SamplingBackend = Literal["flashinfer", "intel_xpu", "pytorch", "ascend"]
HicacheIoBackend = Literal["direct", "kernel", "kernel_ascend"]
DisaggregationMode = Literal["null", "prefill", "decode"]
SpeculativeAttentionMode = Literal["prefill", "decode"]
#: Names rules.yaml still reads that SGLang 0.5.23's parser refuses ("invalid choice"), by Literal: kept in the rule
#: language so that those rules type-check; a launch line giving one is refused with SGLang's message.
SGLANG_REFUSES: dict[str, tuple[str, ...]] = {"AttentionBackendName": ("cutlass_mla",), "KvCacheDtype": ("fp4_e2m1",)}
#: Values SGLang 0.5.23 accepts that attngate's rules do not model, by ServerArgs field: refused with that reason.
NOT_MODELLED: dict[str, tuple[str, ...]] = {"speculative_algorithm": ("UNO", "DSPARK", "FROZEN_KV_MTP")}

#: Kernel packages the attngate backends call (Platform facts ``has_flashinfer``, ``has_flash_attn_cute``,
#: ``has_flash_attn_interface``).
KERNEL_PROVIDERS: tuple[str, ...] = ("flashinfer", "flash_attn.cute", "flash_attn_interface")

ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackendName)
