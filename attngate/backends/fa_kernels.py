"""The two FlashAttention kernels the FA backend calls, behind one interface: ``flash_attn.cute`` (FlashAttention-4)
and ``flash_attn_interface`` (FlashAttention-3), and the per-batch metadata both read. Which one runs, and with which
causality, window, split count and schedule, is the backend's to pass (from the Plan); these only call."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from attngate.backends.runtime.layer import AttentionLayer
from attngate.facts.platform import installed_kernel_modules


def fa_window_size(window_left: int | None, causal: bool) -> tuple[int | None, int | None]:
    """FlashAttention's ``window_size=(left, right)`` for a layer that sees ``window_left`` earlier keys (None: no
    window): a causal layer sees no later key, a bidirectional one as many later keys as earlier ones."""
    return (None, None) if window_left is None else (window_left, 0 if causal else window_left)


@dataclass
class FaMetadata:
    """What the FA kernels read of one batch (or of one captured CUDA graph, over its static buffers).

    Attributes
    ----------
    cu_seqlens_q : torch.Tensor
        ``[bs + 1]`` int32 on the device: the offsets of each request's queries in the token dimension.
    max_seqlen_q : int
        The most queries of one request.
    seqused_k : torch.Tensor or None
        ``[bs]`` int32 on the device: the decoder tokens (keys) the kernel reads per request; None: raw K/V only.
    page_table : torch.Tensor or None
        ``[bs, max_pages]`` int32 on the device: each request's pages in the pool.
    encoder_seqused_k : torch.Tensor or None
        ``[bs]`` int32: cross attention's encoder tokens per request; None: no encoder tokens.
    encoder_page_table : torch.Tensor or None
        ``[bs, max_pages]`` int32: the pages of each request's encoder tokens; None: no encoder tokens.
    scheduler_metadata : object or None
        FA3's precomputed tile-scheduler metadata (:meth:`Fa3Kernel.scheduler_metadata`); None: the kernel derives its
        own.
    local : FaMetadata or None
        Chunked-local layers: the local virtual batches; None: no chunked-local layer.
    """

    cu_seqlens_q: torch.Tensor
    max_seqlen_q: int
    seqused_k: torch.Tensor | None
    page_table: torch.Tensor | None
    encoder_seqused_k: torch.Tensor | None = None
    encoder_page_table: torch.Tensor | None = None
    scheduler_metadata: object | None = None
    local: "FaMetadata | None" = None


class Fa4Kernel:
    """``flash_attn.cute`` (FlashAttention-4)."""

    def __init__(self) -> None:
        self.varlen = importlib.import_module("flash_attn.cute").flash_attn_varlen_func

    def scheduler_metadata(
        self,
        md: FaMetadata,
        layer: AttentionLayer,
        max_seqlen_k: int,
        *,
        num_splits: int,
        page_size: int,
        dtype: torch.dtype,
    ) -> None:
        """None: no plan that names fa3/fa4 precomputes a schedule for flash_attn.cute (invariant
        fa-precompute-only-on-fa3-interface; SGLang's FA4 takes one on SM120 only, where flash_attn.cute pages no
        KV cache). A plan naming neither leaves the gate at its default, which this kernel ignores."""
        return None

    def __call__(
        self,
        q,
        k,
        v,
        *,
        cu_seqlens_q,
        max_seqlen_q,
        seqused_k=None,
        page_table=None,
        cu_seqlens_k=None,
        max_seqlen_k=None,
        layer: AttentionLayer,
        causal: bool,
        window: tuple,
        num_splits: int,
        scheduler_metadata=None,
    ) -> torch.Tensor:  # scheduler_metadata: always None here
        out = self.varlen(
            q,
            k,
            v,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            seqused_k=seqused_k,
            page_table=page_table,
            softmax_scale=layer.scaling,
            causal=causal,
            window_size=window,
            learnable_sink=layer.sinks,
            softcap=layer.logit_cap,
            num_splits=num_splits,  # 0: the kernel's split heuristic
        )
        return out[0] if isinstance(out, tuple) else out

    def mla_absorbed(
        self, q_rope, kpe_cache, ckv_cache, q_latent, *, md: FaMetadata, layer: AttentionLayer, num_splits: int
    ) -> torch.Tensor:
        """Absorbed MLA over the paged latent (SM100): scores ``q_rope . kpe + q_latent . ckv``, values ckv."""
        out = self.varlen(
            q_rope,
            kpe_cache,
            ckv_cache,
            qv=q_latent,
            cu_seqlens_q=md.cu_seqlens_q,
            max_seqlen_q=md.max_seqlen_q,
            seqused_k=md.seqused_k,
            page_table=md.page_table,
            softmax_scale=layer.scaling,
            causal=True,
            num_splits=num_splits,
        )
        return out[0] if isinstance(out, tuple) else out


class Fa3Kernel:
    """FlashAttention-3's interface (``flash_attn_interface``, or sgl_kernel's build of it under SGLang: see
    attngate.facts.platform.KERNEL_MODULES): paged reads through ``flash_attn_with_kvcache``."""

    def __init__(self) -> None:
        modules = installed_kernel_modules()
        self.fa3 = importlib.import_module(modules.get("flash_attn_interface", "flash_attn_interface"))

    def scheduler_metadata(
        self,
        md: FaMetadata,
        layer: AttentionLayer,
        max_seqlen_k: int,
        *,
        num_splits: int,
        page_size: int,
        dtype: torch.dtype,
    ):
        """FA3's tile-scheduler metadata for the paged decode call; every argument that shapes the
        schedule must equal the kernel call's, or FA3 reads a schedule planned for another launch."""
        return self.fa3.get_scheduler_metadata(
            md.seqused_k.shape[0],
            md.max_seqlen_q,
            max_seqlen_k,
            layer.num_q_heads,
            layer.num_kv_heads,
            layer.head_dim,
            md.seqused_k,
            qkv_dtype=dtype,
            headdim_v=layer.v_head_dim,
            cu_seqlens_q=md.cu_seqlens_q,
            page_size=page_size,
            causal=True,
            has_softcap=bool(layer.logit_cap),
            num_splits=num_splits,
        )

    def __call__(
        self,
        q,
        k,
        v,
        *,
        cu_seqlens_q,
        max_seqlen_q,
        seqused_k=None,
        page_table=None,
        cu_seqlens_k=None,
        max_seqlen_k=None,
        layer: AttentionLayer,
        causal: bool,
        window: tuple,
        num_splits: int,
        scheduler_metadata=None,
    ) -> torch.Tensor:
        if layer.sinks is not None:
            raise NotImplementedError("flash_attn_interface has no learned attention sinks; run the fa4 provider")
        window = tuple(-1 if w is None else w for w in window)
        if page_table is None:
            out = self.fa3.flash_attn_varlen_func(
                q,
                k,
                v,
                cu_seqlens_q,
                cu_seqlens_k,
                max_seqlen_q,
                max_seqlen_k,
                softmax_scale=layer.scaling,
                causal=causal,
                window_size=window,
                softcap=layer.logit_cap,
                num_splits=num_splits,
            )
        else:
            out = self.fa3.flash_attn_with_kvcache(
                q,
                k,
                v,
                cache_seqlens=seqused_k,
                page_table=page_table,
                cu_seqlens_q=cu_seqlens_q,
                max_seqlen_q=max_seqlen_q,
                softmax_scale=layer.scaling,
                causal=causal,
                window_size=window,
                softcap=layer.logit_cap,
                num_splits=num_splits,
                scheduler_metadata=scheduler_metadata,
            )
        return out[0] if isinstance(out, tuple) else out

    def mla_absorbed(
        self, q_rope, kpe_cache, ckv_cache, q_latent, *, md: FaMetadata, layer: AttentionLayer, num_splits: int
    ) -> torch.Tensor:
        """Absorbed MLA over the paged latent (SM90), as SGLang's FA3 MLA decode: q = q_rope against the kpe
        cache, qv = q_latent against the ckv cache, which is also V."""
        out = self.fa3.flash_attn_with_kvcache(
            q=q_rope,
            k_cache=kpe_cache,
            v_cache=ckv_cache,
            qv=q_latent,
            page_table=md.page_table,
            cache_seqlens=md.seqused_k,
            cu_seqlens_q=md.cu_seqlens_q,
            max_seqlen_q=md.max_seqlen_q,
            softmax_scale=layer.scaling,
            causal=True,
            num_splits=num_splits,
        )
        return out[0] if isinstance(out, tuple) else out
