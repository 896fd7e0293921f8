"""The FA backend's CUDA graphs: static seqused_k and page_table buffers (and the encoder's and the local
batches' where the layers have them), one FaMetadata per captured (forward mode, batch size), refilled in place at
replay (:meth:`FaKvMetadata.fill`)."""

from __future__ import annotations

import torch

from attngate.backends.checks import captured_graph, check_capture_mode
from attngate.backends.fa_kernels import FaMetadata
from attngate.backends.fa_metadata import FaKvMetadata
from attngate.backends.fa_mla import FaMla
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import Problem, UsageError
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.plan.schema import Plan


class FaCudaGraphs:
    """The captured graphs of an FA backend: the static buffers, and per captured (mode, batch size) its metadata.

    Parameters
    ----------
    plan : Plan
        Reads the mode table's ``common.capture_cuda_graph`` (through :func:`check_capture_mode`).
    layers : list of AttentionLayer
        The backend's layers: cross-attention layers add the encoder's buffers.
    kv : FaKvMetadata
        Fills the static buffers, at capture (and, called by the backend, at each replay).
    mla : FaMla or None
        The MLA path, where the layers have MLA: a graph reads the latent cache absorbed.
    page_size : int
        Tokens per page of the pool.
    device : torch.device
        Where the static buffers live.
    chunk : int or None
        ``attention_chunk_size`` of the chunked-local layers (None: none); their graphs replay DECODE only.
    """

    def __init__(
        self,
        plan: Plan,
        layers: list[AttentionLayer],
        kv: FaKvMetadata,
        mla: FaMla | None,
        page_size: int,
        device: torch.device,
        chunk: int | None,
    ):
        self.plan, self.kv, self.mla = plan, kv, mla
        self.page_size, self.device, self.chunk = page_size, device, chunk
        self._cross = any(
            lay.kind == LayerKind.CROSS_ATTENTION for lay in layers
        )  # graphs of batches with encoder tokens
        self._buffers: dict[str, torch.Tensor] | None = None  # set by init_state
        # per captured (mode, batch size): its own cu_seqlens_q, views of the shared static buffers that replays refill
        self._md: dict[tuple[ForwardMode, int], FaMetadata] = {}

    def init_state(self, max_bs: int) -> None:
        """``init_cuda_graph_state``: the static buffers of up to ``max_bs`` requests."""
        max_pages = self.kv.max_pages
        self._buffers = {
            "seqused_k": torch.zeros(max_bs, dtype=torch.int32, device=self.device),
            "page_table": torch.zeros(max_bs, max_pages, dtype=torch.int32, device=self.device),
        }
        if self._cross:
            self._buffers["encoder_seqused_k"] = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
            self._buffers["encoder_page_table"] = torch.zeros(max_bs, max_pages, dtype=torch.int32, device=self.device)
        if self.chunk is not None:
            self._buffers["local_seqused_k"] = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
            self._buffers["local_page_table"] = torch.zeros(
                max_bs, -(-self.chunk // self.page_size), dtype=torch.int32, device=self.device
            )

    def capture(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode) -> FaMetadata:
        """The metadata of a graph of ``bs`` requests, ``num_tokens // bs`` tokens each, in ``forward_mode``, over the
        static buffers, filled for the capture's lengths. Arguments as ``init_forward_metadata_capture_cuda_graph``'s."""
        g = self._buffers
        check_capture_mode(
            self.plan, bs, forward_mode, None if g is None else g["seqused_k"].shape[0]
        )  # the plan's table decides
        per_req = num_tokens // bs
        if self.chunk is not None and forward_mode != ForwardMode.DECODE:
            raise UsageError(
                Problem(
                    "forward_mode",
                    f"chunked-local layers replay DECODE graphs only, not {forward_mode.value}: "
                    "their local batches vary in number",
                    code="usage.cuda-graph-mode",
                )
            )
        if self.mla is not None:
            self.mla.prepare_graph(forward_mode)
        # not refilled at replay: each graph keeps its own (a graph of another mode at this bs has other offsets)
        cu = torch.arange(0, (bs + 1) * per_req, per_req, device=self.device, dtype=torch.int32)
        md = self._md[(forward_mode, bs)] = FaMetadata(cu, per_req, g["seqused_k"][:bs], g["page_table"][:bs])
        if self.chunk is not None:  # one query per request: one local batch each, the request's current chunk
            md.local = FaMetadata(cu, 1, g["local_seqused_k"][:bs], g["local_page_table"][:bs])
        if encoder_lens is not None:
            if "encoder_seqused_k" not in g:
                raise UsageError(
                    Problem(
                        "encoder_lens",
                        "a CUDA graph with encoder tokens needs a cross-attention layer among the backend's layers",
                        code="usage.cuda-graph-encoder-tokens",
                    )
                )
            md.encoder_seqused_k, md.encoder_page_table = g["encoder_seqused_k"][:bs], g["encoder_page_table"][:bs]
        self.kv.fill(md, forward_mode, req_pool_indices, seq_lens, per_req, encoder_lens, in_place=True)
        return md

    def captured(self, mode: ForwardMode, bs: int) -> FaMetadata:
        """The metadata captured for ``(mode, bs)``; UsageError naming what was captured when there is none."""
        return captured_graph(self._md, mode, bs)
