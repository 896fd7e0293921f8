"""The GPU backend suites (tests/support/suites) on the CPU, through the kernel stand-ins (tests/support/standins):
FlashInfer's and FA's metadata code, CUDA-graph replay (emulated), split-KV batch invariance."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch")

from attngate import ForwardMode, LayerKind  # noqa: E402
from attngate.backends.flashinfer import FlashInferBackend  # noqa: E402
from attngate.errors import BackendRefusal  # noqa: E402
from tests.support.backend_cases import CPU, layer_of, make_case, plan_for  # noqa: E402
from tests.support.standins import flash_attn_cute, flashinfer  # noqa: E402
from tests.support.suites.dp_padding import DpPaddingSuite  # noqa: E402
from tests.support.suites.fa_backend import FaBackendSuite  # noqa: E402
from tests.support.suites.flashinfer_backend import FlashInferBackendSuite  # noqa: E402
from tests.support.suites.plan_backend import PlanBackendSuite  # noqa: E402


@pytest.fixture(autouse=True)
def kernels(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer.module())
    for name, module in flash_attn_cute.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(
        flash_attn_cute, "ARCH", CPU.platform().sm_major
    )  # the suites' plans are an H100's: its limits hold


@pytest.fixture
def env():
    return CPU


def test_fi_refuses_a_fast_replan_plan_on_a_flashinfer_without_fast_decode_plan(env, monkeypatch):
    """A plan that re-plans decode through fast_decode_plan (both gates at page 1), on a FlashInfer that does not export
    it (before 0.7): refused at construction, naming both gates, not at the first replay."""
    monkeypatch.delattr(sys.modules["flashinfer"], "fast_decode_plan")
    plan = plan_for(env, "flashinfer", 1)
    case = make_case(env, [(5, 1)], ForwardMode.DECODE, 1)
    with pytest.raises(BackendRefusal) as err:
        FlashInferBackend(
            plan, case.pools[0], case.setup.req_to_token_pool.req_to_token, [layer_of(env, LayerKind.FULL)], env.device
        )
    assert [p.where for p in err.value.problems] == ["flashinfer.graph_decode_replan", "flashinfer.eager_decode_replan"]
    assert "does not export" in str(err.value)


class TestDpPaddingOnStandins(DpPaddingSuite):
    pass


class TestFaOnStandins(FaBackendSuite):
    pass


class TestFlashInferOnStandins(FlashInferBackendSuite):
    pass


class TestPlanBackendOnStandins(PlanBackendSuite):
    pass
