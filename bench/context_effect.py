"""Is FlashInfer's decode ``plan()`` slower right after other host work than in a tight loop of its own, and is
that specific to the backend's work? Prints one JSON object.

bench_host.py measures the backend's eager metadata against the raw ``plan()`` called in a loop of its own, and
``plan()`` after the backend's host length work costing 40 to 60 µs more than the two apart. Here, in paired rounds
at batch 1 and 64, ``plan()`` runs alone and after each of: the backend's host length work (``BatchLengths``,
``kv_pages``, the host tensors); numpy work of no use, of about the same length; pure-Python work of no use, of
about the same length. ``excess`` is ``(work then plan) - work - plan``. If the numpy work of no use costs
``plan()`` as much, the excess is the price of running ``plan()`` after any C-extension work (caches and branch
predictors no longer hot), which every real server step pays, not work of ours that could be removed.

With CUDA and FlashInfer it times the real wrapper (run on the device); elsewhere the CPU stand-in of tests/support/standins,
whose ``plan()`` is Python and torch CPU ops too: an analog that runs on a CPU machine.
``python3 bench/context_effect.py parts`` times each part of the length work alone and then ``plan()``;
``python3 bench/context_effect.py loop NAME CALLS`` runs one of the timed calls only, for an instruction count under
valgrind (is the excess more work, or the same work running slower?).
"""

from __future__ import annotations

import functools
import json
import platform
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_flashinfer import decode_plan_args, host_length_work  # noqa: E402
from common import paired_host_us  # noqa: E402

from attngate import ForwardMode, LayerKind  # noqa: E402
from attngate.backends.runtime.batch_metadata import BatchLengths, host  # noqa: E402
from tests.support.backend_cases import CPU, GPU, layer_of, make_case, plan_for  # noqa: E402

PS = 16


def _real_kernels() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


def _backend(bs: int, real: bool):
    """The FlashInfer backend over ``bs`` decode requests of 2048 tokens (CPU stand-in: 512), its batch and the raw
    plan() call with prebuilt arguments."""
    if not real:
        from tests.support.standins import flashinfer

        sys.modules["flashinfer"] = flashinfer.module()
    from attngate.backends.flashinfer import FlashInferBackend

    env = GPU if real else CPU
    cached = 2047 if real else 511
    case = make_case(
        env,
        [(cached, 1)] * bs,
        ForwardMode.DECODE,
        PS,
        num_slots=bs * (cached + 17) // PS * PS + PS,
        max_context_len=cached + 17,
    )
    fi = FlashInferBackend(
        plan_for(env, "flashinfer", PS),
        case.pools[0],
        case.setup.req_to_token_pool.req_to_token,
        [layer_of(env, LayerKind.FULL)],
        env.device,
    )
    batch = case.setup.batch
    fi.init_forward_metadata(batch)
    _, args = decode_plan_args(fi, batch)
    wrapper, kw = fi.wrappers.decode[0], fi.planner.plan_kwargs(fi.specs[0], "decode")
    return fi, batch, lambda: wrapper.plan(*args, **kw)


def _calls(bs: int, real: bool, calibrate: bool = True) -> tuple[dict, object, object]:
    """The timed calls: plan(), each work, each work then plan(); and the backend and batch. ``calibrate``: size the
    work of no use by timing it (off for instruction counts, whose set-up must not vary)."""
    fi, batch, plan = _backend(bs, real)

    lengths = functools.partial(host_length_work, batch, PS)  # as bench_host's row "lengths"

    unrelated = np.arange(64, dtype=np.int64)
    numpy_reps = [1]
    python_reps = [1]

    def numpy_work():  # as many tiny numpy calls as take about as long as lengths()
        for _ in range(numpy_reps[0]):
            np.cumsum(unrelated * 3 + 1)

    def python_work():
        return sum(i * i for i in range(python_reps[0]))

    goal = paired_host_us({"lengths": lengths})["lengths"] if calibrate else 0
    for work, reps in ((numpy_work, numpy_reps), (python_work, python_reps)) if calibrate else ():
        for _ in range(4):  # scale the work of no use to the length of the backend's
            reps[0] = max(1, round(reps[0] * goal / paired_host_us({"w": work}, rounds=5)["w"]))
    works = {"lengths": lengths, "numpy_work": numpy_work, "python_work": python_work}
    fns = {
        "plan": plan,
        **works,
        **{f"{name}_then_plan": (lambda w: lambda: (w(), plan()))(w) for name, w in works.items()},
    }
    return fns, fi, batch


def row(bs: int, real: bool) -> dict:
    fns, fi, batch = _calls(bs, real)
    t = paired_host_us(fns)
    out = {k: round(v, 1) for k, v in t.items()}
    out |= {
        f"{name}_excess": round(t[f"{name}_then_plan"] - t[name] - t["plan"], 1)
        for name in ("lengths", "numpy_work", "python_work")
    }
    out |= {"backend_eager_metadata": round(paired_host_us({"m": lambda: fi.init_forward_metadata(batch)})["m"], 1)}
    return out


def parts_row(bs: int, real: bool) -> dict:
    """The length work's parts, each alone and then plan(): which of them costs plan() the excess?"""
    fi, batch, plan = _backend(bs, real)
    lens = BatchLengths.from_batch(batch)
    rng = lens.kv_pages(PS)
    seq_cpu = batch.seq_lens_cpu

    def python_lengths():  # the same decode ranges in pure Python (what a small-batch path could do instead)
        indptr, last = [0], []
        for n in seq_cpu.tolist():
            c = -(-n // PS)
            indptr.append(indptr[-1] + c)
            last.append(n - (c - 1) * PS if c else PS)
        return torch.tensor(indptr, dtype=torch.int32), torch.tensor(last, dtype=torch.int32)

    def python_lengths_numpy_out():  # the same, handing numpy arrays on (as PageRange holds)
        indptr, last = [0], []
        for n in seq_cpu.tolist():
            c = -(-n // PS)
            indptr.append(indptr[-1] + c)
            last.append(n - (c - 1) * PS if c else PS)
        return host(np.array(indptr, dtype=np.int32)), host(np.array(last, dtype=np.int32))

    lengths = functools.partial(host_length_work, batch, PS)

    assert all(torch.equal(a, b) for a, b in zip(python_lengths(), lengths()))
    parts = {
        "lengths": lengths,
        "python_lengths": python_lengths,
        "python_lengths_numpy_out": python_lengths_numpy_out,
        "from_batch": lambda: BatchLengths.from_batch(batch),
        "kv_pages": lambda: lens.kv_pages(PS),
        "host_tensors": lambda: (host(rng.indptr), host(rng.last_page_len)),
        "tensor_to_numpy": lambda: seq_cpu.numpy().astype(np.int64),
        "numpy_arith_int32_out": lambda: np.cumsum((lens.seq + 15) // 16, out=np.zeros(bs + 1, dtype=np.int32)[1:]),
    }
    fns = {"plan": plan, **parts, **{f"{n}_then_plan": (lambda w: lambda: (w(), plan()))(w) for n, w in parts.items()}}
    t = paired_host_us(fns)
    return (
        {n: round(t[n], 1) for n in parts}
        | {f"{n}_excess": round(t[f"{n}_then_plan"] - t[n] - t["plan"], 1) for n in parts}
        | {"plan": round(t["plan"], 1)}
    )


def loop(name: str, calls: int, bs: int = 64) -> None:
    """Run one of the timed calls ``calls`` times and nothing else after the set-up, for an instruction count:
    ``valgrind --tool=callgrind python3 bench/context_effect.py loop NAME CALLS`` at two values of CALLS; the
    difference over the difference in CALLS is the instructions per call."""
    fns, _, _ = _calls(bs, _real_kernels(), calibrate=False)
    for _ in range(calls):
        fns[name]()


def main() -> None:
    real = _real_kernels()
    out: dict = {
        "kernels": "flashinfer" if real else "CPU stand-in (tests/support/standins)",
        "machine": torch.cuda.get_device_name() if real else platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    out["rows_us"] = {bs: row(bs, real) for bs in (1, 64)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    if sys.argv[1:2] == ["loop"]:
        loop(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["parts"]:
        real = _real_kernels()
        print(json.dumps({bs: parts_row(bs, real) for bs in (1, 64)}, indent=2))
    else:
        main()
