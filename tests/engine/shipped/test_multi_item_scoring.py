"""rules.yaml "Multi-item scoring" (--enable-mis; R31, F2, F14)."""

from __future__ import annotations

import pytest

from tests.support.helpers import refusing_rules_of, resolve_flags


def test_multi_item_scoring_runs_one_uncached_paged_prefill_on_flashinfer():
    r = resolve_flags("--enable-mis --attention-backend flashinfer", "Qwen3-8B")
    assert (
        r.server_args.disable_cuda_graph
        and r.server_args.disable_radix_cache
        and r.server_args.chunked_prefill_size == -1
    )
    fi = r.plan.flashinfer
    assert fi.multi_item_scoring and not fi.use_ragged_prefill and fi.prefill_kernel_family == "fa2"


@pytest.mark.parametrize(
    "flags, name, rule",
    [
        ("--enable-mis", "Qwen3-8B", "mis.flashinfer-only"),  # the default fa3 on SM90
        (
            "--enable-mis --attention-backend flashinfer --decode-attention-backend triton",
            "Qwen3-8B",
            "mis.flashinfer-only",
        ),
        (
            "--enable-mis --attention-backend flashinfer",
            "gemma-2-9b",
            "mis.no-sliding-window",
        ),  # SGLang drops the window
    ],
)
def test_multi_item_scoring_rejections(flags, name, rule):
    assert rule in refusing_rules_of(lambda: resolve_flags(flags, name))  # refused, or its default backend refused
