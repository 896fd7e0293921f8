"""rules.yaml "Per forward mode": what DRAFT_EXTEND_V2 reads, and which backend runs each forward mode (SGLang's
HybridAttnBackend)."""

from __future__ import annotations

import pytest

from attngate import ForwardMode, Platform, ServerArgs, resolve
from tests.support.helpers import model, resolve_flags


@pytest.mark.parametrize("backend, gpu", [("fa3", "sm90"), ("fa4", "sm100")])
@pytest.mark.parametrize("cuda_graph", [True, False])
def test_draft_extend_v2_reads_prefix_plus_new(backend, gpu, cuda_graph):
    args = ServerArgs(
        attention_backend=backend,
        speculative_algorithm="EAGLE",
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        disable_cuda_graph=not cuda_graph,
    )
    r = resolve(args, model("Llama-3.1-8B"), Platform.from_name(gpu))
    de = r.plan.mode("draft_extend_v2")
    assert de.fa.kv_extent == "prefix_plus_new"
    assert de.common.capture_cuda_graph is cuda_graph  # replay reads the same kv_extent as eager
    assert r.explanation.modes["draft_extend_v2"]["fa.kv_extent"].origin == "fa.draft-extend-v2-reads-prefix-plus-new"
    assert r.plan.mode("idle").fa.kv_extent == "none"


@pytest.mark.parametrize("spec_mode", ["prefill", "decode"])
def test_each_mode_runs_on_the_backend_sglangs_hybrid_backend_picks(spec_mode):
    """Prefill on FA3, decode on FlashInfer (SGLang's HybridAttnBackend, section 3.1): DECODE and IDLE run on the decode
    backend, TARGET_VERIFY on the decode backend only under --speculative-attention-mode decode, the rest on prefill."""
    flags = (
        "--prefill-attention-backend fa3 --decode-attention-backend flashinfer --speculative-algorithm EAGLE "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
        f"--speculative-attention-mode {spec_mode}"
    )
    r = resolve_flags(flags, "Llama-3.1-8B", "sm90")
    plan = r.plan
    on_decode = {ForwardMode.DECODE, ForwardMode.IDLE} | (
        {ForwardMode.TARGET_VERIFY} if spec_mode == "decode" else set()
    )
    for mode in ForwardMode:
        assert plan.mode(mode).common.runs_on == ("decode" if mode in on_decode else "prefill"), mode
        assert plan.backend_for(mode) == ("flashinfer" if mode in on_decode else "fa3"), mode
    origin = r.explanation.modes["target_verify"]["common.runs_on"].origin
    assert origin == ("hybrid.verify-on-decode-backend-in-decode-mode" if spec_mode == "decode" else "default")
    one = resolve_flags("--attention-backend flashinfer", "Llama-3.1-8B", "sm90").plan  # one backend: nothing to route
    assert all(one.mode(m).common.runs_on == "prefill" and one.backend_for(m) == "flashinfer" for m in ForwardMode)
