"""Every public entry point validates its arguments and raises attngate's own error naming the argument (issue 53):
``verify()`` and ``compare_with_sglang()``, ``conform``'s library call (``run_cases``), the runtime's constructors
(pools, allocator, request table, layers, ForwardBatch, build_batch) and AttngateRuntime. The two-rank cases of
``check_plan_consistency`` and ``dp_max_batch_size`` are in test_distributed.py."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from attngate import ForwardMode, ServerArgs  # noqa: E402
from attngate.backends.runtime.batch_builder import build_batch  # noqa: E402
from attngate.backends.runtime.forward_batch import ForwardBatch  # noqa: E402
from attngate.backends.runtime.kv_cache import (  # noqa: E402
    MHATokenToKVPool,
    MLATokenToKVPool,
    PageAllocator,
    ReqToTokenPool,
    kv_pool_for,
)
from attngate.backends.runtime.layer import AttentionLayer  # noqa: E402
from attngate.errors import UsageError  # noqa: E402
from attngate.facts.modes import LayerKind  # noqa: E402
from attngate.integrations.sglang.cases import Case  # noqa: E402
from attngate.integrations.sglang.compare import CaseResult  # noqa: E402
from attngate.integrations.sglang.conform import run_cases  # noqa: E402
from attngate.integrations.sglang.oracle import SglangMissingError  # noqa: E402
from attngate.integrations.sglang.verify import compare_with_sglang, verify  # noqa: E402
from attngate.rules.load import load_rules  # noqa: E402
from tests.support.helpers import MODELS  # noqa: E402

LLAMA = MODELS / "Llama-3.1-8B.json"
verify_module = importlib.import_module("attngate.integrations.sglang.verify")  # the package exports the function


def _wheres(err: pytest.ExceptionInfo) -> list[str]:
    assert isinstance(err.value, UsageError) and isinstance(err.value, TypeError) and isinstance(err.value, ValueError)
    return [p.where for p in err.value.problems]


def _resolved(**extra) -> SimpleNamespace:
    """What verify() reads of SGLang's ServerArgs after resolve_once()."""
    fields = {"_resolution_finished": True, "_raw_input": {}, "resolved_dict": dict, "model_path": str(LLAMA)}
    return SimpleNamespace(**{**fields, **extra})


# ---- verify() ----------------------------------------------------------------------------------------------------


class SglangServerArgs:  # a class given where an instance goes
    resolved_dict = dict


@pytest.mark.parametrize(
    ("server_args", "message"),
    [
        (SglangServerArgs, "not the class SglangServerArgs"),
        ([], "not list"),
        ("--attention-backend fa3", "not str"),
        (None, "not NoneType"),
        (ServerArgs(), "not ServerArgs"),  # attngate's own, not SGLang's
        (_resolved(_resolution_finished=False), "after resolve_once()"),
        (_resolved(_raw_input=None), "after resolve_once()"),
    ],
)
def test_verify_refuses_what_is_no_resolved_sglang_server_args(server_args, message: str):
    with pytest.raises(UsageError) as err:
        verify(server_args, gpu="sm90")
    assert _wheres(err) == ["server_args"] and message in str(err.value)


@pytest.mark.parametrize("model_path", [None, 3, b"config.json"])
def test_verify_names_a_model_path_that_is_no_path(model_path):
    with pytest.raises(UsageError) as err:
        verify(_resolved(model_path=model_path), gpu="sm90")
    assert _wheres(err) == ["server_args.model_path"] and "pass model_config=" in str(err.value)


def test_verify_lists_every_bad_argument_at_once():
    with pytest.raises(UsageError) as err:
        verify(_resolved(), gpu=90, kernels="sglang", rules="rules.yaml", model_config=3, strict="yes")
    assert sorted(_wheres(err)) == ["gpu", "kernels", "model_config", "rules", "strict"]
    assert "load_rules(path)" in str(err.value)


def test_verify_names_the_deviation_that_excused_each_difference(monkeypatch, caplog):
    sentinel = object()
    result = CaseResult("sglang", {}, {}, differences={"page_size": (64, 16)}, resolution=sentinel)
    result.declared = {"page_size": ["sglang.default-backend-before-speculative-params"]}
    monkeypatch.setattr(verify_module, "compare_case", lambda *args, **kwargs: result)
    with caplog.at_level(logging.INFO, logger="attngate.sglang"):
        assert verify(_resolved(), gpu="sm90") is sentinel
    where = {d.id: d.where for d in load_rules().deviations}["sglang.default-backend-before-speculative-params"]
    assert caplog.messages == [
        "attngate/SGLang difference on page_size (SGLang 64, the Plan 16) declared by deviation "
        f"sglang.default-backend-before-speculative-params ({where})"
    ]
    assert compare_with_sglang(_resolved(), gpu="sm90").declared == result.declared


# ---- conform's library call ---------------------------------------------------------------------------------------


def test_run_cases_names_every_bad_argument_before_looking_for_sglang():
    with pytest.raises(UsageError) as err:
        run_cases(["a case"], str(LLAMA), jobs=0, progress="print")
    assert sorted(_wheres(err)) == ["cases[0]", "jobs", "progress", "rules"]
    with pytest.raises(UsageError) as err:
        run_cases(Case("a", LLAMA, "sm90"), load_rules(), jobs=True)
    assert sorted(_wheres(err)) == ["cases", "jobs"]


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed here")
def test_run_cases_without_sglang_raises_sglang_missing_error():
    with pytest.raises(SglangMissingError, match="install the sglang extra"):
        run_cases([Case("a", LLAMA, "sm90")], load_rules())


# ---- the runtime's constructors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "wheres"),
    [
        (lambda: PageAllocator(0, 16), ["num_pages"]),
        (lambda: PageAllocator("4", 16.0), ["num_pages", "page_size"]),
        (lambda: PageAllocator(4, 16, order="0123"), ["order"]),
        (lambda: PageAllocator(2, 16, order=[0, 0]), ["order"]),
        (lambda: PageAllocator(2, 16, order=[0, True]), ["order"]),
        (lambda: ReqToTokenPool(0, "64", device="gpu0"), ["max_requests", "max_context_len", "device"]),
        (lambda: ReqToTokenPool(2, 8, device=None), ["device"]),
        (lambda: MHATokenToKVPool(64, 0, 1, 2, 8), ["page_size"]),
        (
            lambda: MHATokenToKVPool(64, 16, -1, 0, None, dtype="bf16"),
            ["num_layers", "num_kv_heads", "head_dim", "dtype"],
        ),
        (lambda: MHATokenToKVPool(64, 16, 1, 2, 8, v_head_dim=0, device=object()), ["v_head_dim", "device"]),
        (lambda: MLATokenToKVPool(64, 16, 1, 0, -1, dtype=torch.float32), ["kv_lora_rank", "qk_rope_head_dim"]),
        (lambda: kv_pool_for("Llama", 64, 16, 1, torch.float32, "cpu"), ["model"]),
        (lambda: AttentionLayer(0, 0, 2, 8, 8, 0.3), ["num_q_heads"]),
        (
            lambda: AttentionLayer(
                -1, 4, 2, 8, 8, "0.3", kind="windowed", sliding_window_size=-2, logit_cap=float("nan")
            ),
            ["layer_id", "sliding_window_size", "scaling", "logit_cap", "kind"],
        ),
        (
            lambda: AttentionLayer(0, 4, 2, 8, 8, 0.3, attention_chunk_size=0, sinks=[0.0]),
            ["attention_chunk_size", "sinks"],
        ),
        (lambda: build_batch([(0, 4)], "prefill", page_size=16, num_slots=64, max_context_len=32), ["forward_mode"]),
        (
            lambda: build_batch([(0, -1), 3], ForwardMode.EXTEND, page_size=0, num_slots=64, max_context_len=32),
            ["page_size", "requests[0]", "requests[1]"],
        ),
        (
            lambda: build_batch([(0, 4)], 2, page_size=16, num_slots=64, max_context_len=32, encoder_lens=[1, 2]),
            ["mode", "encoder_lens"],
        ),
    ],
)
def test_a_runtime_constructor_names_every_bad_argument(build, wheres: list[str]):
    with pytest.raises(UsageError) as err:
        build()
    assert _wheres(err) == wheres


def _batch(**changes) -> ForwardBatch:
    i32 = torch.zeros(2, dtype=torch.int32)
    fields = dict(
        forward_mode=ForwardMode.DECODE,
        batch_size=2,
        req_pool_indices=torch.zeros(2, dtype=torch.int64),
        seq_lens=i32,
        seq_lens_cpu=i32,
        extend_prefix_lens=i32,
        extend_seq_lens=i32,
        out_cache_loc=torch.zeros(2, dtype=torch.int64),
    )
    return ForwardBatch(**{**fields, **changes})


def test_a_forward_batch_names_every_field_of_the_wrong_kind():
    with pytest.raises(UsageError) as err:
        _batch(forward_mode="decoding", batch_size=-1, seq_lens=[1, 2], encoder_lens=np.zeros(2), extend_seq_lens_cpu=3)
    assert _wheres(err) == ["batch_size", "forward_mode", "seq_lens", "encoder_lens", "extend_seq_lens_cpu"]


def test_valid_arguments_of_other_integer_and_enum_spellings_are_taken():
    assert _batch(forward_mode="decode").forward_mode is ForwardMode.DECODE
    assert (
        AttentionLayer(np.int64(0), 4, 2, 8, 8, np.float32(0.3), kind="sliding_window").kind is LayerKind.SLIDING_WINDOW
    )
    assert PageAllocator(np.int64(4), 16, order=range(4)).free_pages == 4
    assert MHATokenToKVPool(np.int64(64), 16, 0, 2, 8, device=torch.device("cpu")).num_slots == 64


def test_attngate_runtime_names_a_platform_or_backend_class_of_the_wrong_kind():
    pytest.importorskip("transformers")
    from attngate.integrations.transformers import AttngateRuntime

    with pytest.raises(UsageError) as err:
        AttngateRuntime(torch.nn.Linear(2, 2), platform="sm90", backend_cls="reference")
    assert _wheres(err) == ["platform", "backend_cls"] and "Platform.from_name('sm90')" in str(err.value)


def test_model_config_path_objects_are_taken(monkeypatch):
    monkeypatch.setattr(verify_module, "compare_case", lambda *args, **kwargs: CaseResult("sglang", {}, {}))
    assert verify(_resolved(model_path=Path(LLAMA)), gpu="sm90") is None
