"""Shared GPU test set-up: one batch, two pools holding the same cached prefix (backend under test, reference)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngate import ForwardMode, ModelFacts, Platform, ServerArgs, resolve
from attngate.backends.batch_builder import BatchSetup, build_batch
from attngate.backends.kv_cache import MHATokenToKVPool
from attngate.backends.layer import AttentionLayer
from attngate.backends.reference import ReferenceBackend
from helpers import MODELS

H, HKV, D = 32, 8, 128
DTYPE = torch.bfloat16
TOL = 2e-2  # bf16 kernels against the float32 reference (measured differences are about 1e-2)


def plan_for(backend: str = "fa4", page_size: int = 1, model: str = "Llama-3.1-8B", **args):
    facts = ModelFacts.from_hf_config(MODELS / f"{model}.json")
    return resolve(ServerArgs(attention_backend=backend, page_size=page_size, **args), facts, Platform.detect()).plan


@dataclass
class Case:
    setup: BatchSetup
    pools: tuple[MHATokenToKVPool, MHATokenToKVPool]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    encoder_k: torch.Tensor | None
    encoder_v: torch.Tensor | None


def make_case(requests, mode: ForwardMode, page_size: int, *, encoder_lens=None, num_slots=1 << 16, seed=0,
              max_context_len=8192) -> Case:
    dev = "cuda"
    s = build_batch(requests, mode, page_size=page_size, num_slots=num_slots, max_context_len=max_context_len,
                    encoder_lens=encoder_lens, seed=seed, device=dev)
    gen = torch.Generator(device=dev).manual_seed(seed)
    pools = tuple(MHATokenToKVPool(num_slots, page_size, 1, HKV, D, dtype=DTYPE, device=dev) for _ in range(2))
    new_k, new_v, enc_k, enc_v = [], [], [], []
    for (prefix, new), slots, enc in zip(requests, s.slots, encoder_lens or [0] * len(requests)):
        k = torch.randn(enc + prefix + new, HKV, D, device=dev, generator=gen, dtype=DTYPE)
        v = torch.randn(enc + prefix + new, HKV, D, device=dev, generator=gen, dtype=DTYPE)
        for pool in pools:
            pool.set_kv_buffer(0, slots[: enc + prefix].to(dev), k[: enc + prefix], v[: enc + prefix])
        new_k.append(k[enc + prefix:])
        new_v.append(v[enc + prefix:])
        enc_k.append(k[:enc])
        enc_v.append(v[:enc])
    n = s.batch.num_tokens
    q = torch.randn(n, H, D, device=dev, generator=gen, dtype=DTYPE)
    cat = lambda xs: torch.cat(xs) if xs else torch.empty(0, HKV, D, device=dev, dtype=DTYPE)  # noqa: E731
    return Case(s, pools, q, cat(new_k)[:n], cat(new_v)[:n], cat(enc_k) if encoder_lens else None, cat(enc_v) if encoder_lens else None)


def layer_of(kind, **kw) -> AttentionLayer:
    return AttentionLayer(0, H, HKV, D, D, D ** -0.5, kind=kind, **kw)


def reference_out(case: Case, plan, layer: AttentionLayer) -> torch.Tensor:
    ref = ReferenceBackend(plan, case.pools[1], case.setup.req_to_token_pool.req_to_token, [layer], "cuda")
    ref.init_forward_metadata(case.setup.batch)
    return ref.forward(case.q, case.k, case.v, layer, case.setup.batch)
