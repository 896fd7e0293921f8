"""Runtime errors with clear messages (instead of an index error or an illegal memory access)."""

from __future__ import annotations

from attngate.errors import AttngateError


class KVCacheExhausted(AttngateError):
    """The KV pool (or the request table) has no room for an allocation."""

    title = "KV cache exhausted"


class BatchMetadataError(AttngateError):
    """ForwardBatch metadata that would read or write outside the pool or the request table."""

    title = "invalid forward batch metadata"
