"""transformers' padded attention batch as its mask lays it out, for the plain path
(:mod:`attngate.integrations.transformers_plain`) and its kernel ops (:mod:`attngate.integrations.transformers_ops`):
which queries and keys are valid (:class:`PaddedBatch`, each finding kept per mask in its model's
:class:`MaskFindings`), and the varlen rows each layer kind attends in (one per request; per chunk on a chunked-local
layer; per run of queries that see the same keys on a cross-attention layer)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from attngate.errors import BatchMetadataError, Problem
from attngate.facts.modes import LayerKind


class LayerDecisions(Protocol):
    """What these rows read of a layer's decisions (transformers_context.LayerDecisions, which imports this module for
    its MaskFindings; a protocol here keeps the import one way)."""

    layer_id: int
    kind: LayerKind
    causal: bool
    attention_chunk_size: int | None


T = TypeVar("T")


class MaskFindings:
    """What is found from the masks of one model's forwards in flight (host syncs on the unpadding path, the padded
    FA path's device metadata), kept per mask: transformers hands every layer of a forward the same mask object (one
    per layer type), so the work is paid once per forward, not per layer.

    A mask's findings are kept in a slot with the mask itself (held weakly, so dropped with it) and its version
    counter (a caller's own 4D mask edited in place is another layout), the ``max_masks`` latest masks; without a
    mask, findings are kept by key alone (shapes), the ``max_unmasked`` latest. In a graph nothing is kept: the graph
    computes each finding in place (once per mask: common subexpressions).

    Parameters
    ----------
    max_masks : int
        How many masks' findings are kept at most (transformers' masks of one forward: one per layer type).
    max_unmasked : int
        How many findings of calls without a mask are kept at most (a decode step grows ``S_kv`` every step).
    """

    def __init__(self, max_masks: int = 8, max_unmasked: int = 64) -> None:
        self._slots: list[list[Any]] = []  # [weakref to the mask, its version, {key: finding}], newest first
        self._unmasked: dict[Hashable, Any] = {}
        self._max_masks, self._max_unmasked = max_masks, max_unmasked

    def get(self, mask: torch.Tensor | None, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, kept for ``mask`` as it is now and ``key``.

        Parameters
        ----------
        mask : torch.Tensor or None
            transformers' attention mask, ``[B, 1|H, S, >=S_kv]`` bool or additive; None: kept by ``key`` alone.
        key : Hashable
            What is found and from which shapes, e.g. ``("visible", B, S, S_kv, device, causal)``.
        make : callable
            Finds it (may itself ask for other keys of the same mask).

        Returns
        -------
        object
            What ``make()`` returned, now or for an earlier call (device tensors: callers must not write to them).
        """
        if torch.compiler.is_compiling():
            return make()
        found = self._unmasked if mask is None else self._found(mask)
        if key in found:
            return found[key]
        if mask is None and len(found) >= self._max_unmasked:  # shapes alone: a decode grows S_kv every step
            found.clear()
        value = found[key] = make()
        return value

    def __len__(self) -> int:
        """How many masks' findings are kept (those of masks alive and unedited since)."""
        return sum(1 for ref, _, found in self._slots if found and ref() is not None)

    def _found(self, mask: torch.Tensor) -> dict[Hashable, Any]:
        version = mask._version
        for slot in self._slots:
            if slot[0]() is mask:
                if slot[1] != version:  # edited in place since: its findings are of another layout
                    slot[1] = version
                    slot[2].clear()
                return slot[2]
        found: dict[Hashable, Any] = {}
        # the findings (device tensors) go with the mask; the callback holds them alone, so no cycle keeps either
        ref = weakref.ref(mask, lambda _, found=found: found.clear())
        live = [slot for slot in self._slots if slot[0]() is not None]
        self._slots = [[ref, version, found], *live[: self._max_masks - 1]]
        return found


@dataclass
class PaddedBatch:
    """One attention call's padded batch as transformers' mask lays it out. What is found from the mask is kept in
    ``found`` (its model's, per mask: every layer of a step shares it); findings are tensors callers must not write to.

    Parameters
    ----------
    mask : torch.Tensor or None
        transformers' mask, ``[B, 1|H, S, >=S_kv]`` bool (True: seen) or additive float; None: no padding, causal
        as :func:`unmasked_keys` says.
    b, s, s_kv : int
        Requests, queries per request and keys per request (transformers' cache included).
    device : torch.device
        The queries' device, where findings are made.
    found : MaskFindings
        The model's findings (its :class:`~attngate.integrations.transformers_context.PlainContext`'s).
    """

    mask: torch.Tensor | None
    b: int
    s: int
    s_kv: int
    device: torch.device
    found: MaskFindings

    def kept(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, kept while the mask lives and is not edited in place (see :class:`MaskFindings`)."""
        return self.found.get(self.mask, key, make)

    def visible(self, causal: bool) -> torch.Tensor:
        """``[B, S, S_kv]`` bool: the keys each query may see as transformers masks it (without a mask:
        :func:`unmasked_keys`)."""
        b, s, s_kv, device, mask = self.b, self.s, self.s_kv, self.device, self.mask

        def make() -> torch.Tensor:
            if mask is None:  # causal over the first unmasked_keys keys, bottom-right among them
                end = unmasked_keys(s, s_kv, causal)
                j, i = torch.arange(s_kv, device=device), torch.arange(s, device=device)
                visible = j[None, :] < end
                if causal:
                    visible = visible & (j[None, :] <= i[:, None] + (end - s))
                return visible.expand(b, s, s_kv)
            given = mask[..., :s_kv]
            # an additive mask hides what is at its dtype's minimum or -inf (a NaN or +inf is seen: eager propagates
            # it); a per-head mask shows a key that some head sees
            visible = given if given.dtype == torch.bool else ~(given <= torch.finfo(given.dtype).min / 2)
            return visible.any(1).expand(b, s, s_kv)

        return self.kept(("visible", b, s, s_kv, device, causal), make)

    def valid_sets(self, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, S]`` and ``[B, S_kv]`` bool: the valid queries and keys (:func:`self_attention_valid`) of a batch
        with a mask, which holds its own causality."""
        key = ("valid", self.b, self.s, self.s_kv, self.device, causal)
        return self.kept(key, lambda: self_attention_valid(self.visible(causal=True), causal))

    def extents(self, causal: bool) -> torch.Tensor:
        """``[4, B]`` int32 on the device, without a host sync (the padded FA path, attngate.backends.fa_padded):
        each request's first valid query, end of valid queries, first valid key and end of valid keys in
        transformers' padded positions, each taken to be one run (left padding, or a right-padded prompt's own
        forward; :meth:`one_run` says where it is)."""

        def make() -> torch.Tensor:
            if self.mask is None:  # every query valid, the keys of :func:`unmasked_keys`
                end = unmasked_keys(self.s, self.s_kv, causal)
                return torch.tensor([0, self.s, 0, end], dtype=torch.int32, device=self.device)[:, None].expand(
                    4, self.b
                )
            q_valid, kv_valid = self.valid_sets(causal)
            return torch.stack([*_run(q_valid), *_run(kv_valid)]).to(torch.int32)

        return self.kept(("extents", self.b, self.s, self.s_kv, self.device, causal), make)

    def one_run(self, causal: bool) -> torch.Tensor:
        """``[B]`` bool on the device: whether each request's valid queries and valid keys are one run each, as
        :meth:`extents` takes them. Not so where a request decodes after right padding (its prompt, the padding,
        then what it generated) or a caller's mask has holes."""

        def make() -> torch.Tensor:
            if self.mask is None:
                return torch.ones(self.b, dtype=torch.bool, device=self.device)
            q_valid, kv_valid = self.valid_sets(causal)
            return _is_one_run(q_valid) & _is_one_run(kv_valid)

        return self.kept(("one run", self.b, self.s, self.s_kv, self.device, causal), make)

    def valid_positions(self, visible: torch.Tensor, causal: bool) -> _ValidPositions:
        """The valid positions of ``visible: [B, S, S_kv]`` (made from the mask, or without one from the shape
        alone: causal, or every key). One host sync where not kept."""

        def make() -> _ValidPositions:
            q_valid, kv_valid = self_attention_valid(visible, causal)
            lens = torch.stack([q_valid.sum(1), kv_valid.sum(1)]).to(torch.int32).cpu()
            return _ValidPositions(q_valid.nonzero(as_tuple=True), kv_valid.nonzero(as_tuple=True), lens)

        return self.kept(("rows", causal, *visible.shape, visible.device), make)


@dataclass
class _Rows:
    """A padded batch unpadded into varlen rows: each row's valid keys are contiguous and its valid queries
    are its last positions (left padding, transformers' dynamic and static caches)."""

    q: torch.Tensor  # [total_q, H, D]
    k: torch.Tensor  # [total_k, H_kv, D]
    v: torch.Tensor  # [total_k, H_kv, Dv]
    q_at: tuple[torch.Tensor, torch.Tensor]  # [total_q] int64 each: the request and position of each valid query
    lens: torch.Tensor  # [2, B] int32 on the host: valid queries, valid keys per row

    @property
    def cu_seqlens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cu_seqlens_q, cu_seqlens_k: ``[B + 1]`` int32 on the host."""
        cu = torch.nn.functional.pad(torch.cumsum(self.lens, 1, dtype=torch.int32), (1, 0))
        return cu[0], cu[1]

    def pad_back(self, out: torch.Tensor, query: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """``[total_q, H, Dv]`` -> ``[B, S, H, Dv]``, zeros at padding queries (transformers ignores them)."""
        padded = out.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
        padded[self.q_at] = out
        return padded


def unpad(query, key, value, visible: torch.Tensor, layer: LayerDecisions, batch: PaddedBatch) -> _Rows:
    """Varlen rows from transformers' mask ``visible: [B, S, S_kv]``: one per request (its valid queries over its
    valid keys), where each valid position is found once per mask (:meth:`PaddedBatch.valid_positions`); on a
    chunked-local layer one per request and chunk; on a cross-attention layer one per run of a request's queries that
    see the same keys (host syncs at every call)."""
    if layer.attention_chunk_size:
        return _chunk_rows(query, key, value, visible, self_attention_valid(visible, layer.causal)[0], layer)
    if layer.kind == LayerKind.CROSS_ATTENTION:
        return _key_set_rows(query, key, value, visible, visible.any(-1))
    at = batch.valid_positions(visible, layer.causal)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    return _Rows(q[at.q], k[at.k], v[at.k], at.q, at.lens)


@dataclass(frozen=True)
class _ValidPositions:
    """Where a padded batch's valid queries and keys sit: (request, position) index pairs, ``[total]`` int64 each."""

    q: tuple[torch.Tensor, torch.Tensor]
    k: tuple[torch.Tensor, torch.Tensor]
    lens: torch.Tensor  # [2, B] int32 on the host


def self_attention_valid(visible: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, S]`` and ``[B, S_kv]`` bool of a self-attention mask ``visible: [B, S, S_kv]``: a valid key is one some
    query sees; a valid query sees some key and sits on a valid key. Seeing keys alone is not enough: under
    transformers' causal mask a right-padding query sees the valid keys before it. Causal: a query's last visible key
    is its own position, so a padding query repeats the last one of the query before it (wherever the queries sit in
    a static cache); otherwise the queries are the keys (no cache)."""
    q_sees, kv_valid = visible.any(-1), visible.any(1)
    if not causal:
        return q_sees & kv_valid[:, visible.shape[2] - visible.shape[1] :], kv_valid
    last = torch.where(visible, torch.arange(visible.shape[2], device=visible.device), -1).amax(-1)
    moved = torch.nn.functional.pad(last[:, 1:] != last[:, :-1], (1, 0), value=True)
    return q_sees & moved, kv_valid


def _run(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Start and end of the valid run of each row of ``valid: [B, N]`` (both 0 where none is valid)."""
    n = valid.shape[-1]
    j = torch.arange(n, device=valid.device)
    start = torch.where(valid, j, n).amin(-1)
    end = torch.where(valid, j + 1, 0).amax(-1)
    return torch.minimum(start, end), end


def _is_one_run(valid: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: whether each row's valid positions are one run (or none)."""
    start, end = _run(valid)
    return valid.sum(-1) == end - start


def _chunk_rows(query, key, value, visible: torch.Tensor, q_valid: torch.Tensor, layer: LayerDecisions) -> _Rows:
    """Chunked local attention (SGLang's local virtual batches): the queries of a request that share a chunk (the
    same first visible key) form one row over the keys from that chunk's first one to the row's last query, so
    that causal bottom-right alignment within the row is the chunk's mask."""
    row, first, last = chunk_extents(visible, q_valid, layer)
    _, q_lens = torch.unique_consecutive(row * visible.shape[-1] + first, return_counts=True)
    ends = q_lens.cumsum(0) - 1  # each chunk row's last query
    k_lens = last[ends] - first[ends] + 1
    k_rows = torch.repeat_interleave(row[ends], k_lens)
    k_cols = torch.arange(int(k_lens.sum())) - torch.repeat_interleave(k_lens.cumsum(0) - k_lens - first[ends], k_lens)
    return _gathered_rows(query, key, value, q_valid, q_lens, k_lens, k_rows, k_cols)


def _key_set_rows(query, key, value, visible: torch.Tensor, q_valid: torch.Tensor) -> _Rows:
    """Cross attention: each run of consecutive queries of a request that see the same keys (the text after one
    image, say) forms one non-causal row over exactly those keys."""
    rows = _request_of(q_valid)
    seen = visible[q_valid]  # [total_q, S_kv], queries in order
    starts = torch.ones(rows.shape[0], dtype=torch.bool, device=visible.device)
    starts[1:] = (rows[1:] != rows[:-1]) | (seen[1:] != seen[:-1]).any(-1)
    firsts = starts.nonzero()[:, 0]
    group, k_cols = seen[firsts].nonzero(as_tuple=True)  # each run's keys, run by run
    q_lens = torch.diff(firsts, append=firsts.new_tensor([rows.shape[0]]))
    return _gathered_rows(
        query, key, value, q_valid, q_lens.cpu(), seen[firsts].sum(-1).cpu(), rows[firsts][group], k_cols
    )


def _request_of(q_valid: torch.Tensor) -> torch.Tensor:
    """``[total_q]`` int64: the request (batch row) of each valid query, in row-major order."""
    b, s = q_valid.shape
    return torch.arange(b, device=q_valid.device)[:, None].expand(b, s)[q_valid]


def _gathered_rows(
    query,
    key,
    value,
    q_valid: torch.Tensor,
    q_lens: torch.Tensor,
    k_lens: torch.Tensor,
    k_rows: torch.Tensor,
    k_cols: torch.Tensor,
) -> _Rows:
    """Rows of ``q_lens`` consecutive valid queries each over the keys ``key[k_rows, :, k_cols]``, row after row
    (lengths on the host, indices on either side)."""
    k_rows, k_cols = k_rows.to(key.device, non_blocking=True), k_cols.to(key.device, non_blocking=True)
    k, v = key.transpose(1, 2)[k_rows, k_cols], value.transpose(1, 2)[k_rows, k_cols]
    q_at = q_valid.nonzero(as_tuple=True)
    return _Rows(query.transpose(1, 2)[q_at], k, v, q_at, torch.stack([q_lens, k_lens]).to(torch.int32))


def chunk_extents(visible: torch.Tensor, q_valid: torch.Tensor, layer: LayerDecisions) -> torch.Tensor:
    """``[3, total_q]`` int64 on the host (one sync), per valid query in row-major order: its row, first and last
    visible key. Raises BatchMetadataError naming the layer where the mask shows a query keys that are not one
    range, or more of them than the plan's attention_chunk_size."""
    s_kv = visible.shape[-1]
    j = torch.arange(s_kv, device=visible.device)
    first, last = torch.where(visible, j, s_kv).amin(-1), torch.where(visible, j, -1).amax(-1)
    row, first, last, count = torch.stack(
        [_request_of(q_valid), first[q_valid], last[q_valid], visible.sum(-1)[q_valid]]
    ).cpu()
    span, where, problems = last - first + 1, f"layer {layer.layer_id}", []
    if bool((span != count).any()):
        problems.append(
            Problem(
                where,
                "transformers' mask shows a query keys that are not one range; a chunked-local "
                "layer attends to the keys of one chunk up to the query",
                code="batch-metadata.local-mask-not-a-range",
            )
        )
    if span.numel() and int(span.max()) > layer.attention_chunk_size:
        problems.append(
            Problem(
                where,
                f"transformers' mask shows a query {int(span.max())} keys, more than the plan's "
                f"attention_chunk_size {layer.attention_chunk_size}: the model does not chunk this "
                "layer as the plan says",
                code="batch-metadata.local-mask-past-chunk",
            )
        )
    if problems:
        raise BatchMetadataError(problems)
    return torch.stack([row, first, last])


def unmasked_keys(s: int, s_kv: int, causal: bool) -> int:
    """How many of the ``s_kv`` keys a batch given no mask attends to, by the convention of the mask function
    attngate registers (transformers' ``sdpa_mask``, whose None means sdpa's ``is_causal``): a causal layer's
    ``s > 1`` queries sit top-left (query i sees keys 0..i): keys past ``s`` are a static cache's empty slots
    (transformers skips the mask of an empty static cache's prefill); one query, or a non-causal layer, sees every key."""
    return s if causal and s > 1 else s_kv
