"""The FA backend's CUDA graphs: static seqused_k and page_table buffers (and the encoder's and the local
batches' where the layers have them), one FaMetadata per captured (forward mode, batch size), refilled in place at
replay. A mixin of :class:`attngate.backends.flashattention.FlashAttentionBackend`, whose metadata fill it calls."""

from __future__ import annotations

import torch

from attngate.backends.checks import captured_graph, check_capture_mode, check_graph_batch
from attngate.backends.fa_kernels import FaMetadata
from attngate.backends.mla import absorbed_for_batch
from attngate.errors import Problem, UsageError
from attngate.facts.modes import ForwardMode, LayerKind


class FaCudaGraphs:
    """The CUDA-graph hooks of the backend API (see :class:`attngate.backends.base.AttentionBackend`)."""

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        max_pages = self._max_pages
        self._graph = {
            "seqused_k": torch.zeros(max_bs, dtype=torch.int32, device=self.device),
            "page_table": torch.zeros(max_bs, max_pages, dtype=torch.int32, device=self.device),
        }
        if any(lay.kind == LayerKind.CROSS_ATTENTION for lay in self.layers):  # graphs of batches with encoder tokens
            self._graph["encoder_seqused_k"] = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
            self._graph["encoder_page_table"] = torch.zeros(max_bs, max_pages, dtype=torch.int32, device=self.device)
        if self.chunk is not None:
            self._graph["local_seqused_k"] = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
            self._graph["local_page_table"] = torch.zeros(
                max_bs, -(-self.chunk // self.page_size), dtype=torch.int32, device=self.device
            )

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode
    ):
        g = self._graph
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
                )
            )
        self._graph_mla_form(forward_mode)
        # not refilled at replay: each graph keeps its own (a graph of another mode at this bs has other offsets)
        cu = torch.arange(0, (bs + 1) * per_req, per_req, device=self.device, dtype=torch.int32)
        self.md = self._graph_md[(forward_mode, bs)] = FaMetadata(
            cu, per_req, g["seqused_k"][:bs], g["page_table"][:bs]
        )
        if self.chunk is not None:  # one query per request: one local batch each, the request's current chunk
            self.md.local = FaMetadata(cu, 1, g["local_seqused_k"][:bs], g["local_page_table"][:bs])
        if encoder_lens is not None:
            if "encoder_seqused_k" not in g:
                raise UsageError(
                    Problem(
                        "encoder_lens",
                        "a CUDA graph with encoder tokens needs a cross-attention layer among the backend's layers",
                    )
                )
            self.md.encoder_seqused_k, self.md.encoder_page_table = (
                g["encoder_seqused_k"][:bs],
                g["encoder_page_table"][:bs],
            )
        self._fill_kv_metadata(self.md, forward_mode, req_pool_indices, seq_lens, per_req, encoder_lens, in_place=True)

    def _graph_mla_form(self, mode: ForwardMode) -> None:
        """Graph modes read the latent cache absorbed (their shapes are fixed; decompressing a prefix is not)."""
        if self._mla is None:
            return
        if not absorbed_for_batch(self.plan.mode(mode).common.mla_form, True):
            raise UsageError(
                Problem(
                    "forward_mode",
                    f"the plan runs MLA non-absorbed in {mode.value}; only absorbed modes replay as CUDA graphs",
                )
            )
        self._mla_absorbed, self._mla_kv = True, None

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs,
        req_pool_indices,
        seq_lens,
        seq_lens_cpu,
        encoder_lens,
        forward_mode,
        encoder_lens_cpu=None,
        spec_tree_mask=None,
    ):
        md = self.md = captured_graph(self._graph_md, forward_mode, bs)  # eager batches in between replaced self.md
        self._graph_mla_form(forward_mode)
        per_req = md.max_seqlen_q
        self.spec_tree(forward_mode, spec_tree_mask, [per_req] * bs)  # chains only
        if self.checked:
            check_graph_batch(
                self,
                bs,
                per_req,
                req_pool_indices,
                seq_lens,
                seq_lens_cpu,
                encoder_lens,
                forward_mode,
                encoder_lens_cpu,
            )
        self._fill_kv_metadata(
            md,
            forward_mode,
            req_pool_indices,
            seq_lens,
            per_req,
            encoder_lens,
            in_place=True,
            encoder_lens_cpu=encoder_lens_cpu,
        )
