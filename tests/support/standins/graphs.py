"""CUDA-graph capture and replay emulated on the CPU.

A replayed graph re-launches the captured kernels with the captured arguments: the same scalars, the
same metadata buffers (whatever they hold now). Host code between the launches does not run again.
On the CPU the backend's forward does run again, so the stand-in kernels check what a real replay
would make true: every launch of a replay matches the launch captured at its position, with equal
scalars and integer (metadata) tensors in the same storage. Float tensors are computed in the graph,
so only their shapes must match.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class GraphRecorder:
    """Graphs by name (a backend may hold several, e.g. one per forward mode at a batch size)."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.graphs: dict[str, list[tuple]] = {}
        self.launches: list[tuple] = []
        self.position = 0

    @contextmanager
    def capture(self, name: str = "graph"):
        self.phase, self.launches = "capture", []
        self.graphs[name] = self.launches
        try:
            yield
        finally:
            self.phase = None

    @contextmanager
    def replay(self, name: str = "graph"):
        self.phase, self.position, self.launches = "replay", 0, self.graphs[name]
        try:
            yield
            assert self.position == len(self.launches), (
                f"replay launched {self.position} kernels, the capture {len(self.launches)}"
            )
        finally:
            self.phase = None

    def launch(self, kernel: str, **args) -> None:
        """Record (capture) or check (replay) one kernel launch."""
        if self.phase is None:
            return
        signature = (kernel, {name: _identity(value) for name, value in args.items()})
        if self.phase == "capture":
            self.launches.append(signature)
            return
        assert self.position < len(self.launches), f"replay launches {kernel} beyond the {len(self.launches)} captured"
        captured = self.launches[self.position]
        self.position += 1
        assert captured[0] == kernel, f"replay launches {kernel} where the graph holds {captured[0]}"
        differing = sorted(name for name in signature[1] if signature[1][name] != captured[1].get(name))
        assert not differing, (
            f"replay of {kernel} passes other {differing} than the captured launch (a graph reads the captured ones)"
        )


def _identity(value):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            return ("float tensor", tuple(value.shape))
        return (
            "int tensor",
            value.untyped_storage().data_ptr(),
            value.storage_offset(),
            tuple(value.shape),
            tuple(value.stride()),
        )
    if isinstance(value, (list, tuple)):
        return tuple(_identity(v) for v in value)
    return value


RECORDER = GraphRecorder()
