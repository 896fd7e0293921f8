"""The plan's kernel facts against the real kernels on this GPU: a configuration the rules accept runs, and one they
refuse fails in the kernel (flash_attn.cute: fa.cute-head-dims, fa.cute-fp8-kv-on-sm100-only,
fa.cute-pages-on-sm90-and-sm100-only, written from flash-attn-4 4.0.0b36's source; FlashInfer: flashinfer.head-dims,
measured), and the flash_attn.cute stand-in of the CPU suite, run as this GPU, agrees. This is where the rules meet
the installed kernels."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
cute = pytest.importorskip("flash_attn.cute")

from attngate import ModelFacts, PlanError, Platform, ServerArgs, resolve  # noqa: E402
from tests.support.helpers import MODELS  # noqa: E402

PAGE = 16
HEADS, KV_HEADS, PAGES_PER_REQ, BS = 8, 2, 4, 3


def _platform() -> Platform:
    major, minor = torch.cuda.get_device_capability()
    return Platform.from_name(f"sm{major}{minor}", kernels=["flashinfer", "flash_attn.cute"])


def _plan_accepts(head_dim: int, kv_cache_dtype: str) -> bool:
    raw = json.loads((MODELS / "Llama-3.1-8B.json").read_text())
    facts = ModelFacts.from_hf_dict({**raw, "head_dim": head_dim}, source=f"Llama-3.1-8B, head_dim {head_dim}")
    try:
        resolve(ServerArgs(attention_backend="fa4", page_size=PAGE, kv_cache_dtype=kv_cache_dtype), facts, _platform())
    except PlanError:
        return False
    return True


def _kernel_runs(head_dim: int, kv_dtype: torch.dtype, kernel=None) -> bool:
    """One paged decode call (the FA backend's: cu_seqlens_q, seqused_k, page_table, one split) with these K/V, through
    ``kernel`` (default the installed flash_attn.cute)."""
    kernel = kernel or cute.flash_attn_varlen_func
    dev = "cuda"
    q = torch.randn(BS, HEADS, head_dim, device=dev, dtype=torch.bfloat16)
    cache = [torch.randn(BS * PAGES_PER_REQ, PAGE, KV_HEADS, head_dim, device=dev).to(kv_dtype) for _ in range(2)]
    cu = torch.arange(BS + 1, device=dev, dtype=torch.int32)
    used = torch.full((BS,), PAGES_PER_REQ * PAGE - 5, device=dev, dtype=torch.int32)
    table = torch.arange(BS * PAGES_PER_REQ, device=dev, dtype=torch.int32).view(BS, PAGES_PER_REQ)
    if kv_dtype != torch.bfloat16:
        q = q.to(kv_dtype)
    try:
        kernel(
            q,
            cache[0],
            cache[1],
            cu_seqlens_q=cu,
            max_seqlen_q=1,
            seqused_k=used,
            page_table=table,
            causal=True,
            num_splits=1,
        )
        torch.cuda.synchronize()
    except (AssertionError, NotImplementedError, ValueError, RuntimeError, TypeError):
        return False
    return True


def _standin_runs(head_dim: int, kv_dtype: torch.dtype) -> bool:
    """The same call through the CPU suite's stand-in, holding it to this GPU's limits."""
    from tests.support.standins import flash_attn_cute

    flash_attn_cute.ARCH = torch.cuda.get_device_capability()[0]
    try:
        return _kernel_runs(head_dim, kv_dtype, flash_attn_cute.flash_attn_varlen_func)
    finally:
        flash_attn_cute.ARCH = None


@pytest.mark.parametrize("head_dim", [64, 128, 256, 512])
def test_the_head_dims_the_plan_accepts_are_the_ones_the_kernel_runs(head_dim):
    assert (
        _plan_accepts(head_dim, "auto")
        == _kernel_runs(head_dim, torch.bfloat16)
        == _standin_runs(head_dim, torch.bfloat16)
    )


def test_an_fp8_cache_is_accepted_where_the_kernel_reads_one():
    assert (
        _plan_accepts(128, "fp8_e4m3")
        == _kernel_runs(128, torch.float8_e4m3fn)
        == _standin_runs(128, torch.float8_e4m3fn)
    )


def _flashinfer_prefill_runs(head_dim: int) -> bool:
    """One causal ragged prefill of two requests through FlashInfer's fa2 kernels (the family off SM90, and for every
    head dim outside fa3's)."""
    fi = pytest.importorskip("flashinfer")
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa2")
    qo_indptr = torch.tensor([0, 7, 20], dtype=torch.int32)
    q = torch.randn(20, HEADS, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(20, KV_HEADS, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    try:
        wrapper.plan(qo_indptr, qo_indptr, HEADS, KV_HEADS, head_dim, causal=True, q_data_type=torch.bfloat16)
        wrapper.run(q, k, v)
        torch.cuda.synchronize()
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_flashinfer_runs_the_head_dims_the_plan_accepts(head_dim):
    """flashinfer.head-dims: all-MiniLM-L6-v2's head dim 32 fails in FlashInfer's prefill ("Invalid configuration").
    Head dim 80 read out of bounds on an H100 (an illegal memory access, which ends the process's CUDA context, so it is
    not run here); the rule refuses both."""
    raw = json.loads((MODELS / "Llama-3.1-8B.json").read_text())
    facts = ModelFacts.from_hf_dict({**raw, "head_dim": head_dim}, source=f"Llama-3.1-8B, head_dim {head_dim}")
    try:
        resolve(ServerArgs(attention_backend="flashinfer"), facts, _platform())
        accepted = True
    except PlanError:
        accepted = False
    assert accepted == _flashinfer_prefill_runs(head_dim)


HEAD_DIM_GRID = (4, 8, 12, 16, 32, 64, 72, 96, 100, 128, 136, 160, 192, 256, 264, 512, 576)
#: shapes flash_attn.cute's validator lets through on SM100 that attngate's FA backend does not plan for an MHA
#: layer: FA4 serves them with its absorbed-MLA kernel only (one latent KV head), which attngate plans from MLA facts
VALIDATOR_ONLY = {(10, 64, 512), (10, 512, 512)}


def test_flash_attn_cute_head_dims_match_its_own_validator_over_a_grid():
    """Every (head_dim, head_dim_v) of the grid on SM90 and SM100 (the validator takes the architecture as an argument,
    so both are checked on any GPU): attngate's capability equals flash_attn.cute's _validate_head_dims for 16-bit
    inputs, but for the declared absorbed-MLA shapes. A new flash-attn-4 that moves a bound fails here."""
    from types import SimpleNamespace

    from flash_attn.cute.interface import _validate_head_dims

    from attngate.backends.capabilities import _cute_runs_head_dims

    differences, checked = [], 0
    for arch in (9, 10):
        for d in HEAD_DIM_GRID:
            for dv in HEAD_DIM_GRID:
                try:
                    _validate_head_dims(d, dv, arch, 8)
                    kernel = True
                except AssertionError:
                    kernel = False
                ours = _cute_runs_head_dims(SimpleNamespace(head_dim=d, v_head_dim=dv), arch)
                checked += 1
                if ours != kernel and (arch, d, dv) not in VALIDATOR_ONLY:
                    differences.append((arch, d, dv, kernel, ours))
    assert checked == 2 * len(HEAD_DIM_GRID) ** 2
    assert not differences, f"(arch, head_dim, head_dim_v, validator, attngate): {differences}"


def test_platform_detect_reads_the_gpu_torch_sees():
    """Platform.detect() reads device 0's compute capability from the CUDA driver itself (no torch): the device torch
    runs on, CUDA_VISIBLE_DEVICES applied alike."""
    major, minor = torch.cuda.get_device_capability(0)
    assert (Platform.detect().gpu_arch, Platform.detect().sm_major) == (f"sm{major}{minor}", major)
