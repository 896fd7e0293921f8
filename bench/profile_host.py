"""Where the host time of one decode step goes (run on the device): cProfile of the FlashInfer and FA
backends' per-batch metadata, CUDA-graph re-plan and forward at batch 64, top entries by own time.
``gc``: the FlashInfer rows with Python's GC on and off; ``launch``: what one page-table launch costs;
``fa_step``: the FA eager step against its metadata followed by the raw KV write + call."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from common import decode_graph_replay  # noqa: E402

from attngate import ForwardMode, LayerKind  # noqa: E402
from attngate.backends.flashattention import FlashAttentionBackend  # noqa: E402
from attngate.backends.flashinfer import FlashInferBackend  # noqa: E402
from tests.support.backend_cases import GPU, layer_of, make_case, plan_for  # noqa: E402


def decode_case(bs: int, ps: int):
    """``bs`` decode requests of 2048 tokens (2047 cached) on ``ps``-token pages, the shape every row here times."""
    return make_case(
        GPU,
        [(2047, 1)] * bs,
        ForwardMode.DECODE,
        ps,
        num_slots=bs * (2048 + ps) // ps * ps + ps,
        max_context_len=2048 + ps,
    )


def profile(name: str, fn, iters: int = 300, top: int = 22) -> None:
    for _ in range(20):
        fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    print(f"===== {name} ({iters} calls)\n{text.getvalue()}")


def parts(bs: int = 64) -> None:
    """Host µs of the pieces of one FlashInfer decode metadata step, and of the alternatives to its copies."""
    import torch
    from common import host_us

    from attngate.backends import page_ids as pid
    from attngate.backends.runtime import batch_metadata as bm

    case = decode_case(bs, 16)
    batch, rtt = case.setup.batch, case.setup.req_to_token_pool.req_to_token
    lens = bm.BatchLengths.from_batch(batch)
    rng = lens.kv_pages(16)
    packed_dev = bm.host(rng.packed).cuda()
    out = torch.empty(rng.total_pages, dtype=torch.int32, device="cuda")
    launch = pid._triton_page_ids()
    rows = {
        "BatchLengths.from_batch": lambda: bm.BatchLengths.from_batch(batch),
        "kv_pages": lambda: lens.kv_pages(16),
        "h2d pageable": lambda: bm.host(rng.packed).to("cuda", non_blocking=True),
        "torch.empty cuda": lambda: torch.empty(rng.total_pages, dtype=torch.int32, device="cuda"),
        "triton launch": lambda: launch(rtt, lens.rows, packed_dev, None, out, 16),
        "page_ids": lambda: pid.page_ids(rtt, lens.rows, rng, 16),
        "page_table (FA layout)": lambda: pid.page_table(rtt, lens.rows, 128, 16),
        "torch add (one op)": lambda: packed_dev + 1,
    }
    print("===== parts, host us")
    for name, fn in rows.items():
        print(f"{name:28s} {host_us(fn):8.1f}")


def launch_cost() -> None:
    """Host µs of one FA-layout page table (decode, 2048 cached tokens per request) built four ways, paired rounds:
    Triton through its JIT dispatch (what the backends run), Triton through the compiled kernel's own launcher
    (the dispatch's argument binding and specialisation skipped), ``page_table`` as the backends call it (with its
    ``torch.empty``), and torch ops (``index_select`` into the table, then an in-place floor division); beside
    them one torch op and the backend's host length work, for scale."""
    import json

    import torch
    from common import paired_host_us

    from attngate.backends import page_ids as pid
    from attngate.backends import page_ids_triton as pt
    from attngate.backends.runtime import batch_metadata as bm

    out = {}
    for bs in (1, 64, 256):
        for ps in (16, 128):
            case = decode_case(bs, ps)
            batch, rtt = case.setup.batch, case.setup.req_to_token_pool.req_to_token
            rows = batch.req_pool_indices
            pages = -(-int(batch.seq_lens_cpu.max()) // ps)
            table, ref = torch.empty(bs, pages, dtype=torch.int32, device="cuda"), pid.page_table(rtt, rows, pages, ps)
            args = (rtt, rows, rows, rows, table, rtt.stride(0), rtt.shape[1], pages, ps)
            compiled = pt._page_ids_kernel[(bs,)](*args, CSR=False, HAS_FIRST=False, BLOCK=64)
            strided = rtt[:, : pages * ps : ps]

            def torch_ops():
                torch.index_select(strided, 0, rows, out=table)
                table.div_(ps, rounding_mode="floor")

            def compiled_launch():
                compiled[(bs, 1, 1)](*args, False, False, 64)  # the constexprs positionally, as the launcher takes them

            for fn in (compiled_launch, torch_ops):
                table.zero_()
                fn()
                assert torch.equal(table, ref)
            row = paired_host_us(
                {
                    "triton_jit_dispatch": lambda: pt.launch(rtt, rows, None, None, table, ps, pages),
                    "triton_compiled_launcher": compiled_launch,
                    "page_table_as_called": lambda: pid.page_table(rtt, rows, pages, ps),
                    "torch_ops": torch_ops,
                    "one_torch_add": lambda: batch.seq_lens + 1,
                    "host_length_work": lambda: bm.BatchLengths.from_batch(batch).max_seq,
                }
            )
            out[f"bs {bs}, page {ps}"] = {k: round(v, 1) for k, v in row.items()}
    print("===== page-table launch cost, host us\n" + json.dumps(out, indent=1))


def gc_effect(bs: int = 64) -> None:
    """Host µs of FlashInfer's eager decode metadata, its raw plan(), and the backend's host length work followed by
    the raw plan(), with Python's cyclic GC on and off (paired rounds): does garbage collection account for plan()
    running slower after our host work?"""
    import gc

    from bench_flashinfer import decode_plan_args, host_length_work, setup
    from common import paired_host_us

    fi, case, layer, _ = setup([(2047, 1)] * bs, ForwardMode.DECODE, plan_for(GPU, "flashinfer", 16))
    batch, spec, wrapper = case.setup.batch, fi.specs[0], fi.wrappers.decode[0]
    _, args = decode_plan_args(fi, batch)
    kw = fi.planner.plan_kwargs(spec, "decode")

    def lengths_then_plan():
        host_length_work(batch, 16)
        wrapper.plan(*args, **kw)

    fns = {
        "eager_metadata": lambda: fi.init_forward_metadata(batch),
        "raw_plan": lambda: wrapper.plan(*args, **kw),
        "lengths_then_raw_plan": lengths_then_plan,
    }
    rows = {}
    for state in ("gc_on", "gc_off"):
        gc.enable() if state == "gc_on" else gc.disable()
        rows[state] = {k: round(v, 1) for k, v in paired_host_us(fns).items()}
    gc.enable()
    print("===== gc effect, host us, batch", bs, rows)


def fa_step() -> None:
    """Where the FA eager decode step's host time over the raw call goes (paired rounds, µs per call): the backend's
    forward on prebuilt metadata against the raw KV write + call it makes (our per-layer plumbing), and the metadata
    followed by the raw write + call against the whole step (what running after our metadata costs the raw call)."""
    from bench_flashattention import backend_and_raw
    from common import paired_host_us

    for bs in (1, 64):
        fa, case, layer, step, raw, layer_forward = backend_and_raw(
            [(2047, 1)] * bs, ForwardMode.DECODE, plan_for(GPU, "fa4", 128)
        )
        batch, pool = case.setup.batch, case.pools[0]

        def raw_write_call():
            pool.set_kv_buffer(0, batch.out_cache_loc, case.k, case.v)
            return raw()

        def metadata_then_raw():
            fa.init_forward_metadata(batch)
            return raw_write_call()

        rows = paired_host_us(
            {
                "raw_call": raw,
                "raw_write_call": raw_write_call,
                "forward": layer_forward,
                "metadata": lambda: fa.init_forward_metadata(batch),
                "metadata_then_raw_write_call": metadata_then_raw,
                "step": step,
            }
        )
        print("===== fa step, host us, batch", bs, {k: round(v, 1) for k, v in rows.items()})


def main(bs: int = 64) -> None:
    parts(bs)
    layer = layer_of(GPU, LayerKind.FULL)
    for name, cls, backend, ps in (
        ("flashinfer", FlashInferBackend, "flashinfer", 16),
        ("fa", FlashAttentionBackend, "fa4", 128),
    ):
        case = decode_case(bs, ps)
        be = cls(plan_for(GPU, backend, ps), case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], "cuda")
        batch = case.setup.batch
        profile(f"{name} init_forward_metadata", lambda: be.init_forward_metadata(batch))
        profile(f"{name} forward", lambda: be.forward(case.q, case.k, case.v, layer, batch))
        replay = decode_graph_replay(be, case, layer, bs)
        profile(f"{name} replay incl. metadata update", replay)


if __name__ == "__main__":
    if sys.argv[1:] == ["gc"]:
        for size in (1, 64):
            gc_effect(size)
    elif sys.argv[1:] == ["launch"]:
        launch_cost()
    elif sys.argv[1:] == ["fa_step"]:
        fa_step()
    else:
        main()
