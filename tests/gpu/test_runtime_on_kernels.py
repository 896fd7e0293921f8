"""AttngateRuntime on the GPU with its default backend, the plan's own (PlanBackend: FA through flash_attn.cute,
FlashInfer, FlashInfer MLA; prefill and decode apart where the plan splits them), over attngate's paged KV cache:
two prompts of uneven length through chunked prefill (the second chunk over the cached prefix), then decode steps
teacher-forced with the prompts' tokens; bf16 logits against one full forward of sdpa (eager where transformers has
no sdpa path), relative to the largest logit."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("flashinfer")
pytest.importorskip("flash_attn.cute")

from attngate import ForwardMode, ServerArgs  # noqa: E402
from attngate.backends.plan_backend import PlanBackend  # noqa: E402
from attngate.integrations.transformers import AttngateRuntime  # noqa: E402
from tests.gpu.test_transformers_plain import TOL, model_pair  # noqa: E402

# (model, flags, page_size, backend of EXTEND / DECODE); FA's paged calls on SM90 take pages of 1 or 128 tokens
CASES = [
    ("llama", "", 128, ("fa3", "fa3")),
    ("llama", "--attention-backend flashinfer", 16, ("flashinfer", "flashinfer")),
    ("llama", "--prefill-attention-backend fa3 --decode-attention-backend flashinfer", 1, ("fa3", "flashinfer")),
    ("mistral-swa", "--attention-backend flashinfer", 1, ("flashinfer", "flashinfer")),
    ("gemma2-softcap-swa", "", 128, ("fa3", "fa3")),
    ("gpt-oss-sinks", "", 128, ("fa3", "fa3")),
    ("llama4-chunked", "", 1, ("fa3", "fa3")),
    ("deepseek-v3-mla", "", 64, ("flashinfer", "flashinfer")),
]
PROMPTS, CHUNK, DECODED = (40, 27), 16, 8  # prompt tokens; the first EXTEND; tokens of each prompt's end decoded


@pytest.mark.parametrize(
    "name, flags, page_size, backends",
    CASES,
    ids=[f"{n}-{f.replace(' ', '') or 'default'}-{p}" for n, f, p, _ in CASES],
)
def test_the_runtime_on_the_plans_kernels_matches_sdpa(name, flags, page_size, backends):
    ref, ours = model_pair(name)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 512, (n,), generator=gen).cuda() for n in PROMPTS]
    with torch.no_grad():
        full = [ref(p[None]).logits[0] for p in prompts]
    rt = AttngateRuntime(
        ours,
        server_args=ServerArgs.from_flags([*flags.split(), "--page-size", str(page_size)]),
        page_size=page_size,
        num_slots=1024,
        max_requests=4,
        max_context_len=256,
    )
    assert isinstance(rt.backend, PlanBackend)
    assert (rt.plan.backend_for(ForwardMode.EXTEND), rt.plan.backend_for(ForwardMode.DECODE)) == backends
    reqs = [rt.add_request() for _ in prompts]
    ends = [n - DECODED for n in PROMPTS]
    got: list[list[torch.Tensor]] = [[], []]
    out = rt.extend({r: p[:CHUNK] for r, p in zip(reqs, prompts)})  # no prefix
    got[0].append(out[:CHUNK])
    got[1].append(out[CHUNK:])
    out = rt.extend({r: p[CHUNK:e] for r, p, e in zip(reqs, prompts, ends)})  # over the cached prefix
    got[0].append(out[: ends[0] - CHUNK])
    got[1].append(out[ends[0] - CHUNK :])
    for i in range(DECODED):
        out = rt.decode({r: p[e + i] for r, p, e in zip(reqs, prompts, ends)})
        got[0].append(out[:1])
        got[1].append(out[1:])
    for k in range(2):
        a, b = full[k].float(), torch.cat(got[k]).float()
        err = ((a - b).abs().max() / a.abs().max()).item()
        assert err < TOL, f"{name} {flags} page {page_size}, request {k}: {err:.3e} of the largest logit"
