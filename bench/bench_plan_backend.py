"""What PlanBackend's per-mode dispatch costs; prints one JSON object.

A plan with prefill on FA (flash_attn.cute) and decode on FlashInfer (page 128, Llama-3.1-8B's 32/8 heads x 128, bf16):
per decode step (64 requests of 2048 tokens) and per extend step (8 requests, 256 new tokens over 1792 cached), the
host µs of ``PlanBackend.init_forward_metadata`` + ``forward`` against the same two calls on the backend the plan names
for the mode, timed in the same rounds (common.paired_host_us), the latter twice to show the spread of the timing
itself. Run on the device: on the CPU stand-ins the kernels' own torch compute (about 100 ms a step) buries the dispatch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from common import paired_host_us  # noqa: E402

from attngate import ForwardMode, LayerKind  # noqa: E402
from attngate.backends.plan_backend import PlanBackend  # noqa: E402
from tests.support.backend_cases import GPU, layer_of, make_case, plan_for  # noqa: E402

PS = 128


def main() -> None:
    env = GPU
    plan = plan_for(env, None, PS, prefill_attention_backend="fa3", decode_attention_backend="flashinfer")
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name, mode, requests in (
        ("decode 64 x 2048", ForwardMode.DECODE, [(2047, 1)] * 64),
        ("extend 8 x (1792 + 256)", ForwardMode.EXTEND, [(1792, 256)] * 8),
    ):
        layer = layer_of(env, LayerKind.FULL)
        case = make_case(env, requests, mode, PS, num_slots=len(requests) * 2304, max_context_len=2304)
        batch = case.setup.batch
        dispatch = PlanBackend(plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer], env.device)
        inner = dispatch.backend_of(mode)

        def step(backend):
            backend.init_forward_metadata(batch)
            return backend.forward(case.q, case.k, case.v, layer, batch)

        # the backend alone twice, first and last of each round: how far two timings of the same calls lie apart
        row = paired_host_us(
            {
                "its_backend": lambda: step(inner),
                "plan_backend": lambda: step(dispatch),
                "its_backend_again": lambda: step(inner),
            }
        )
        row = {k: round(v, 1) for k, v in row.items()}
        out[name] = row | {
            "backend": type(inner).__name__,
            "dispatch_us": round(row["plan_backend"] - row["its_backend"], 1),
            "same_calls_apart_us": round(row["its_backend_again"] - row["its_backend"], 1),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
