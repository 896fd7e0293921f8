"""Shared by the bench scripts: GPU and host timing, and a replayed decode step."""

from __future__ import annotations

import time
from typing import Callable

import torch

from attngate import ForwardMode


def _sync() -> None:
    """Drain the GPU before a timed round (nothing to drain on a CPU-only machine)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cuda_ms(fn: Callable[[], object], iters: int = 30, warmup: int = 5) -> float:
    """Mean GPU time per call in ms (CUDA events around ``iters`` back-to-back calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def paired_ms(
    a: Callable[[], object], b: Callable[[], object], iters: int = 30, rounds: int = 5
) -> tuple[float, float]:
    """GPU ms per call of ``a`` and of ``b``, timed alternately for ``rounds`` rounds; the best round of
    each, so that clock and thermal drift during the run does not favour whichever ran first."""
    times = [(cuda_ms(a, iters), cuda_ms(b, iters)) for _ in range(rounds)]
    return min(t for t, _ in times), min(t for _, t in times)


def host_us(fn: Callable[[], object], iters: int = 50, rounds: int = 3) -> float:
    """Host time per call in µs: best of ``rounds`` runs of ``iters`` calls, the GPU drained before each.
    ``iters`` stays small so that the launch queue never fills and blocks the host on GPU work."""
    for _ in range(10):
        fn()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, time.perf_counter() - t0)
    torch.cuda.synchronize()
    return best / iters * 1e6


def paired_host_us(fns: dict[str, Callable[[], object]], iters: int = 30, rounds: int = 15) -> dict[str, float]:
    """Host µs per call of each of ``fns``, timed in turn round after round; the best round of each. Host time on a
    shared machine drifts by 30 % within a run, so only functions timed in the same rounds are compared."""
    for fn in fns.values():
        for _ in range(10):
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            _sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    _sync()
    return {name: t / iters * 1e6 for name, t in best.items()}


def decode_graph_replay(backend, case, layer, bs: int):
    """Capture one DECODE forward of ``case`` as a CUDA graph; returns a replay step (metadata update + replay)."""
    batch = case.setup.batch
    backend.init_cuda_graph_state(bs, bs)
    backend.init_forward_metadata_capture_cuda_graph(
        bs, bs, batch.req_pool_indices, batch.seq_lens, None, ForwardMode.DECODE
    )
    backend.forward(case.q, case.k, case.v, layer, batch)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.forward(case.q, case.k, case.v, layer, batch)

    def replay():
        backend.init_forward_metadata_replay_cuda_graph(
            bs, batch.req_pool_indices, batch.seq_lens, batch.seq_lens_cpu, None, ForwardMode.DECODE
        )
        graph.replay()

    return replay
