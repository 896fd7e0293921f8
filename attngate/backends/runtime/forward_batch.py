"""``ForwardBatch``: the per-forward metadata every backend reads (SGLang's names and meanings)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngate.errors import Problem, UsageError, argument_problems, count_problems
from attngate.facts.modes import ForwardMode


@dataclass
class ForwardBatch:
    """One forward pass over ``batch_size`` requests.

    Attributes:
        forward_mode: EXTEND, DECODE, TARGET_VERIFY, DRAFT_EXTEND_V2 or IDLE.
        batch_size: number of requests (0 for IDLE).
        req_pool_indices: ``[batch_size]`` int64, rows of ``req_to_token``.
        seq_lens: ``[batch_size]`` int32, tokens in the cache *after* this forward's tokens are
            written (every mode; for encoder-decoder models it includes the encoder tokens).
        seq_lens_cpu: the same, on the host.
        extend_prefix_lens: ``[batch_size]`` int32, tokens already cached before this forward.
        extend_seq_lens: ``[batch_size]`` int32, new tokens of this forward (1 for DECODE).
        out_cache_loc: ``[num_tokens]`` int64, the slot each new token's K/V is written to, in
            request order.
        encoder_lens: ``[batch_size]`` int32 encoder tokens at the start of each request's row of
            ``req_to_token``, or None for decoder-only models.
        encoder_out_cache_loc: ``[num_encoder_tokens]`` int64, slots the encoder K/V of cross-attention
            layers are written to when this forward carries them, else None.
        extend_seq_lens_cpu: the new-token counts on the host (lets GPU backends size kernels
            without a device-to-host copy), or None.
        encoder_lens_cpu: ``encoder_lens`` on the host, or None (then read from the device at a sync).
        spec_tree_mask: TARGET_VERIFY over a speculative tree (the plan's ``common.tree_mask``): ``[batch_size, D, D]``
            bool on the device, D draft tokens per request in their flattened order; ``[r, i, j]`` is true when
            draft token j of request r is draft token i's ancestor or i itself (so only for j <= i). None otherwise.
    """

    forward_mode: ForwardMode
    batch_size: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    encoder_lens: torch.Tensor | None = None
    encoder_out_cache_loc: torch.Tensor | None = None
    extend_seq_lens_cpu: list[int] | None = None
    encoder_lens_cpu: torch.Tensor | None = None
    spec_tree_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        """UsageError naming every field of the wrong kind (a few isinstance checks: no device sync, no shape check;
        attngate.backends.checks.check_batch checks the values against the pool). ``forward_mode`` may be given as
        its value (``"decode"``)."""
        problems = count_problems(("batch_size", self.batch_size, 0))
        try:
            self.forward_mode = ForwardMode(self.forward_mode)
        except (ValueError, TypeError):
            modes = ", ".join(m.value for m in ForwardMode)
            problems.append(
                Problem(
                    "forward_mode",
                    f"takes a ForwardMode ({modes}), not {self.forward_mode!r:.80}",
                    code="usage.forward-mode",
                )
            )
        problems += argument_problems(
            *((name, getattr(self, name), torch.Tensor, "") for name in _TENSORS),
            *((name, getattr(self, name), (torch.Tensor, type(None)), "") for name in _OPTIONAL_TENSORS),
            ("extend_seq_lens_cpu", self.extend_seq_lens_cpu, (list, tuple, type(None)), "the new-token counts"),
        )
        if problems:
            raise UsageError(problems)

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.shape[0])


_TENSORS = ("req_pool_indices", "seq_lens", "seq_lens_cpu", "extend_prefix_lens", "extend_seq_lens", "out_cache_loc")
_OPTIONAL_TENSORS = ("encoder_lens", "encoder_out_cache_loc", "encoder_lens_cpu", "spec_tree_mask")
