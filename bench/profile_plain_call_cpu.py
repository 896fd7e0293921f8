"""Where the Python of one eager decode attention call of the plain transformers path goes, on any CPU: the FA4 kernel
stubbed out (a compiled function that writes nothing, reached through flash_attn.cute's compile cache as on the GPU,
so the fast launch of attngate/backends/fa4_launch.py replays it), every tensor on the CPU counted as on the GPU.
µs a call of the whole call and of its parts, the best of five rounds of 3000 calls.

    python bench/profile_plain_call_cpu.py              # llama-shaped layer 0 (16/4 heads x 128), 1 x 513 keys
    python bench/profile_plain_call_cpu.py --keys 2049 --batch 8
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import torch
import transformers

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

import attngate.integrations.transformers  # noqa: E402,F401 - registers "attngate"
from attngate.backends import fa4_launch, fa_padded  # noqa: E402
from attngate.integrations import transformers_ops, transformers_plain  # noqa: E402
from attngate.integrations.transformers_rows import PaddedBatch  # noqa: E402


def _stub_flash_attn() -> types.ModuleType:
    """``flash_attn.cute`` whose public call launches a do-nothing compiled function through its compile cache with
    flash-attn-4 4.0.0b36's argument order, so the fast launch records and replays it."""

    class Fwd:
        compile_cache = {"kernel": lambda *args: None}

    cute = types.ModuleType("flash_attn.cute")

    def flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, **kw):
        out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
        lse = q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32) if kw["return_lse"] else None
        left, right = kw["window_size"]
        Fwd.compile_cache["kernel"](
            q, k, v, out, lse, kw["softmax_scale"], cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, None, left,
            right, kw["learnable_sink"], None, (None, None), None, None,
        )  # fmt: skip
        return (out, lse) if kw["return_lse"] else out

    cute.flash_attn_varlen_func = flash_attn_varlen_func
    fa4_launch._interface = lambda: types.SimpleNamespace(_flash_attn_fwd=Fwd)
    return cute


def _us(fn, calls: int = 3000) -> float:
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--keys", type=int, default=513)
    args = parser.parse_args()
    sys.modules["flash_attn.cute"] = _stub_flash_attn()
    transformers_plain._on_gpu = lambda t: True
    h, h_kv, d = 16, 4, 128
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=h * d, intermediate_size=64, num_hidden_layers=1, num_attention_heads=h,
        num_key_value_heads=h_kv, head_dim=d,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="attngate", dtype=torch.bfloat16)
    module = model.model.layers[0].self_attn
    b, s_kv = args.batch, args.keys
    q = torch.randn(b, 1, h, d, dtype=torch.bfloat16).transpose(1, 2)  # as transformers projects it
    k, v = (torch.randn(b, h_kv, s_kv, d, dtype=torch.bfloat16) for _ in range(2))  # a DynamicCache's
    transformers_plain.plain_attention(module, q, k, v, None)  # records the launch
    context, decisions = transformers_plain.decisions_of(module)
    batch = PaddedBatch(None, b, 1, s_kv, q.device, context.masks)
    q_rows = q.reshape(b, h, d)
    cu_q, cu_k, used_q, used_k = fa_padded.rows(batch.extents(True), 1, h_kv * s_kv)
    k_rows, v_rows = fa_padded.token_rows(k)[0], fa_padded.token_rows(v)[0]
    cute = sys.modules["flash_attn.cute"]
    parts = {
        "the whole call (plain_attention)": lambda: transformers_plain.plain_attention(module, q, k, v, None),
        "  the layer's decisions": lambda: transformers_plain.decisions_of(module),
        "  the padded FA call (fa_in_place)": lambda: transformers_ops.fa_in_place(
            decisions, batch, q, k, v, None, 0.1
        ),
        "    K/V token rows (one view each)": lambda: fa_padded.token_rows(k),
        "    the fast launch (fa4_launch)": lambda: fa4_launch.flash_attn_varlen(
            cute,
            q_rows,
            k_rows,
            v_rows,
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            seqused_q=used_q,
            seqused_k=used_k,
            max_seqlen_q=1,
            max_seqlen_k=1024,
            softmax_scale=0.1,
            causal=True,
            window_size=(None, None),
            learnable_sink=None,
            softcap=0.0,
        ),  # fmt: skip
        "      its output's allocation": lambda: q_rows.new_empty(b, h, d),
        "  one tensor view (for scale)": lambda: q.reshape(b, h, d),
    }
    print(f"b{b} x {s_kv} keys, {h}/{h_kv} heads x {d}, torch {torch.__version__}, µs a call:")
    for name, fn in parts.items():
        print(f"  {name:40s} {_us(fn):6.2f}")


if __name__ == "__main__":
    main()
