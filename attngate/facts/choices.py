"""SGLang's choice lists for attention-relevant server arguments, as ``Literal`` types.

Source: sglang ``server_args.py`` / ``arg_groups.choices`` (ATTENTION_BACKEND_CHOICES,
DRAFT_ATTENTION_BACKEND_CHOICES, kv cache dtypes, speculative algorithms). attngate ships backends
for only some of them, but every name SGLang accepts is a valid input here.
"""

from __future__ import annotations

from typing import Literal, get_args

#: The SGLang release whose argument resolution, choice lists and kernels rules.yaml models.
SGLANG_VERSION = "0.5.23"

AttentionBackendName = Literal[
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "nsa",
    "dsv4",
    "compressed",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
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
SamplingBackend = Literal["flashinfer", "pytorch", "ascend"]
HicacheIoBackend = Literal["direct", "kernel", "kernel_ascend"]
DisaggregationMode = Literal["null", "prefill", "decode"]
SpeculativeAttentionMode = Literal["prefill", "decode"]
GpuArch = Literal["sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm120", "sm121"]

#: The backends attngate ships or plans (the candidates `explain` evaluates for rejection reasons).
CANDIDATE_BACKENDS: tuple[str, ...] = ("fa3", "fa4", "flashinfer", "triton", "torch_native")

#: Kernel packages the attngate backends call (Platform facts ``has_flashinfer``, ``has_flash_attn_cute``,
#: ``has_flash_attn_interface``).
KERNEL_PROVIDERS: tuple[str, ...] = ("flashinfer", "flash_attn.cute", "flash_attn_interface")

ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackendName)
GPU_ARCHS: tuple[str, ...] = get_args(GpuArch)
