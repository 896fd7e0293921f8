"""KV-cache write (``set_kv_buffer``) on the GPU: ways of scattering K and V rows into the pool.

The write is the part of an EXTEND forward that a raw attention-kernel call does not pay; this
script times, side by side on the same tensors, the row-scatter variants torch offers, so that the
pool uses the fastest one. Prints one JSON object (run on the device).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from common import cuda_ms  # noqa: E402

from attngate.backends.runtime.kv_cache import MHATokenToKVPool  # noqa: E402

HKV, D = 8, 128


def variants(k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    def index_put():
        k_buf[loc] = k
        v_buf[loc] = v

    def index_copy():
        k_buf.index_copy_(0, loc, k)
        v_buf.index_copy_(0, loc, v)

    wide_kb, wide_vb = (
        k_buf.view(k_buf.shape[0], -1).view(torch.int64),
        v_buf.view(v_buf.shape[0], -1).view(torch.int64),
    )
    wide_k, wide_v = k.reshape(k.shape[0], -1).view(torch.int64), v.reshape(v.shape[0], -1).view(torch.int64)

    def index_copy_int64_rows():
        wide_kb.index_copy_(0, loc, wide_k)
        wide_vb.index_copy_(0, loc, wide_v)

    wide2_kb, wide2_vb = (
        k_buf.view(k_buf.shape[0], -1).view(torch.complex128),
        v_buf.view(v_buf.shape[0], -1).view(torch.complex128),
    )
    wide2_k, wide2_v = (
        k.reshape(k.shape[0], -1).view(torch.complex128),
        v.reshape(v.shape[0], -1).view(torch.complex128),
    )

    def index_copy_16byte_rows():
        wide2_kb.index_copy_(0, loc, wide2_k)
        wide2_vb.index_copy_(0, loc, wide2_v)

    return {
        "index_put": index_put,
        "index_copy": index_copy,
        "index_copy_int64_rows": index_copy_int64_rows,
        "index_copy_16byte_rows": index_copy_16byte_rows,
    }


def main() -> None:
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    num_slots = 64 * 4096 + 4096
    pool = MHATokenToKVPool(num_slots, 128, 1, HKV, D, device="cuda")
    k_buf, v_buf = pool.get_kv_buffer(0)
    for n in (64, 32768):
        loc = torch.randperm(num_slots, device="cuda")[:n]
        k, v = (
            torch.randn(n, HKV, D, device="cuda", dtype=torch.bfloat16),
            torch.randn(n, HKV, D, device="cuda", dtype=torch.bfloat16),
        )
        moved = 2 * 2 * n * HKV * D * 2  # K and V, read and written, bf16
        row = {}
        for name, fn in {
            **variants(k_buf, v_buf, loc, k, v),
            "pool.set_kv_buffer": lambda: pool.set_kv_buffer(0, loc, k, v),
        }.items():
            ms = cuda_ms(fn, iters=50)
            row[name] = {"ms": round(ms, 4), "GBps": round(moved / ms / 1e6, 1)}
        pool.set_kv_buffer(0, loc, k, v)
        row["pool_write_correct"] = bool(torch.equal(k_buf[loc], k) and torch.equal(v_buf[loc], v))
        out[f"tokens_{n}"] = row
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
