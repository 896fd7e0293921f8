"""rules.yaml "Deterministic inference": fixed split sizes on every FlashInfer wrapper kind and every FA path, and the
backends deterministic inference refuses."""

from __future__ import annotations

import pytest

from attngate import PlanError, Platform, ServerArgs, resolve
from tests.engine.shipped.common import SGLANG_FLASHINFER_PLAN_TIME
from tests.support.helpers import fa3_gpu, model


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "gemma-2-9b", "whisper-large-v3-turbo"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_flashinfer_every_wrapper_kind(name, deterministic):
    r = resolve(
        ServerArgs(attention_backend="flashinfer", enable_deterministic_inference=deterministic),
        model(name),
        Platform.from_name("sm90"),
        allow_known_failures=SGLANG_FLASHINFER_PLAN_TIME,  # gemma-2 on SGLang's FlashInfer (sglang issue 33915)
    )
    fi = r.plan.flashinfer
    assert (
        fi.wrapper_dispatch
        == {"Llama-3.1-8B": "single", "gemma-2-9b": "sliding_window", "whisper-large-v3-turbo": "cross_attention"}[name]
    )
    if deterministic:
        assert (fi.prefill_fixed_split_size, fi.decode_fixed_split_size) == (4096, 2048)
        assert fi.cuda_graph_disable_split_kv and fi.decode_use_tensor_cores and not fi.use_ragged_prefill
        assert r.server_args.sampling_backend == "pytorch"
    else:
        assert (fi.prefill_fixed_split_size, fi.decode_fixed_split_size, fi.cuda_graph_disable_split_kv) == (
            None,
            None,
            False,
        )
        assert fi.use_ragged_prefill is not m_is_multimodal(name)


def m_is_multimodal(name: str) -> bool:
    return model(name).is_multimodal


@pytest.mark.parametrize("backend, gpu", [("fa3", "sm90"), ("fa4", "sm100")])
def test_deterministic_fa_num_splits(backend, gpu):
    for det in (False, True):
        r = resolve(
            ServerArgs(attention_backend=backend, enable_deterministic_inference=det),
            model("Llama-3.1-8B"),
            fa3_gpu(gpu),
        )
        assert r.plan.fa.num_splits == (1 if det else 0)
        assert r.plan.fa.decode_fixed_split_keys == (4096 if det else None)  # attngate's own split: fixed points
    for backend, fa3_installed in (("fa4", True), ("fa3", False)):  # FA4's flash_attn.cute cannot split KV on SM90
        r = resolve(
            ServerArgs(attention_backend=backend),
            model("Llama-3.1-8B"),
            Platform.from_name("sm90", has_flash_attn_interface=fa3_installed),
        )
        assert r.plan.fa.num_splits == 1 and r.plan.fa.provider == "flash_attn.cute"
    r = resolve(ServerArgs(attention_backend="fa3"), model("Llama-3.1-8B"), fa3_gpu())
    assert r.plan.fa.provider == "flash_attn_interface"


@pytest.mark.parametrize("runs_sglang", [True, False])
def test_fa3_interface_serves_a_model_with_sinks_in_sglang_only(runs_sglang):
    """Upstream flash_attn_interface (attngate's own backends) has no learned sinks: gpt-oss on fa3 runs
    flash_attn.cute, with its limits. SGLang's FA3 is sgl_kernel's, which takes them."""
    for name in ("gpt-oss-20b", "Llama-3.1-8B"):
        for installed in (True, False):
            r = resolve(
                ServerArgs(attention_backend="fa3"),
                model(name),
                Platform.from_name("sm90", has_flash_attn_interface=installed, runs_sglang=runs_sglang),
            )
            interface = installed and (runs_sglang or not model(name).has_attention_sinks)
            assert r.plan.fa.provider == ("flash_attn_interface" if interface else "flash_attn.cute")
            assert r.plan.fa.num_splits == (0 if interface else 1)


def test_deterministic_rejects_other_backends_and_defaults_by_arch():
    with pytest.raises(PlanError, match="support deterministic inference"):
        resolve(
            ServerArgs(attention_backend="torch_native", enable_deterministic_inference=True),
            model("Llama-3.1-8B"),
            Platform.from_name("sm90"),
        )
    for gpu, name, expected in [
        ("sm90", "Llama-3.1-8B", "fa3"),
        ("sm100", "Llama-3.1-8B", "flashinfer"),
        ("sm100", "DeepSeek-V2-Lite", "triton"),
    ]:
        r = resolve(ServerArgs(enable_deterministic_inference=True), model(name), Platform.from_name(gpu))
        assert r.plan.prefill_backend == expected
