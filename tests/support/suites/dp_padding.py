"""DP-attention padding (attngate.backends.runtime.dp_padding) through the FA and FlashInfer backends against the reference:
a padded decode batch keeps its own rows and writes only the padding slot; an IDLE rank's padded batch runs."""

from __future__ import annotations

import pytest
import torch

from attngate import ForwardMode, LayerKind
from attngate.backends.factories import backend_factory
from attngate.backends.runtime.batch_builder import build_batch
from attngate.backends.runtime.dp_padding import pad_decode_batch
from attngate.errors import BatchMetadataError
from tests.support.backend_cases import layer_of, make_case, plan_for, reference_out

BACKENDS = ("fa4", "flashinfer")
PS = 16


def _free_slot(case) -> int:
    """A slot of a page no request holds: the server's reserved padding slot."""
    used = {int(s) // PS for s in torch.cat(case.setup.slots)}
    return next(p for p in range(case.pools[0].num_slots // PS) if p not in used) * PS


def _padded_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([t, torch.randn(n - t.shape[0], *t.shape[1:], device=t.device).to(t.dtype)])


class DpPaddingSuite:
    """The suite, run where a test module subclasses it (with its own ``env`` fixture): on the CPU stand-ins
    (tests/backends/test_standin_backends.py) and on the GPU kernels (tests/gpu)."""

    @pytest.mark.parametrize("name", BACKENDS)
    def test_dp_padded_decode_keeps_its_rows_and_writes_only_the_padding_slot(self, env, name):
        plan = plan_for(env, name, PS)
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, [(5, 1), (300, 1), (17, 1)], ForwardMode.DECODE, PS)
        expected = reference_out(env, case, plan, layer)
        pad_slot, pool = _free_slot(case), case.pools[0]
        padded = pad_decode_batch(case.setup.batch, 5, padding_row=0, padding_slot=pad_slot)
        assert padded.batch_size == 5 and padded.out_cache_loc.tolist()[3:] == [pad_slot] * 2
        before = pool.k_buffer[0].clone()
        backend = backend_factory(name)(
            plan, pool, case.setup.req_to_token_pool.req_to_token, [layer], env.device, checked=True
        )
        backend.init_forward_metadata(padded)
        out = backend.forward(_padded_rows(case.q, 5), _padded_rows(case.k, 5), _padded_rows(case.v, 5), layer, padded)
        assert out.shape[0] == 5
        assert (out[:3].float() - expected.float()).abs().max().item() < env.tol
        changed = (pool.k_buffer[0] != before).flatten(1).any(1).nonzero().flatten().tolist()
        assert set(changed) <= {*case.setup.batch.out_cache_loc.tolist(), pad_slot} and pad_slot in changed

    @pytest.mark.parametrize("name", BACKENDS)
    def test_an_idle_rank_padded_to_the_global_batch_size_runs_a_decode_forward(self, env, name):
        plan = plan_for(env, name, PS)
        layer = layer_of(env, LayerKind.FULL)
        h, hkv, d = env.heads
        idle = build_batch(
            [(3, 1)], ForwardMode.IDLE, page_size=PS, num_slots=1 << 12, max_context_len=256, device=env.device
        )
        case = make_case(
            env, [(3, 1)], ForwardMode.DECODE, PS, num_slots=1 << 12, max_context_len=256
        )  # a pool to run in
        padded = pad_decode_batch(idle.batch, 4, padding_row=0, padding_slot=_free_slot(case))
        backend = backend_factory(name)(
            plan, case.pools[0], idle.req_to_token_pool.req_to_token, [layer], env.device, checked=True
        )
        backend.init_forward_metadata(padded)
        rows = lambda n: torch.randn(4, n, d, device=env.device).to(env.dtype)  # noqa: E731
        out = backend.forward(rows(h), rows(hkv), rows(hkv), layer, padded)
        assert out.shape == (4, h, d) and bool(torch.isfinite(out.float()).all())

    def test_dp_padding_refuses_what_it_cannot_pad_listing_every_problem(self, env):
        extend = make_case(env, [(5, 3)], ForwardMode.EXTEND, PS).setup.batch
        with pytest.raises(BatchMetadataError) as err:
            pad_decode_batch(extend, 0, padding_row=-1, padding_slot=0)
        text = str(err.value)
        assert "forward_mode" in text and "batch_size" in text and "padding_row" in text
