"""ServerArgs from flags, files and objects; Platform."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from attngate import Platform, PlatformError, ServerArgs, ServerArgsError


def test_flags_in_sglang_spelling():
    args = ServerArgs.from_flags(
        "--attention-backend fa3 --chunked-prefill-size -1 --enable-dp-attention --dp-size 2 --page-size=16".split()
    )
    assert (
        args.attention_backend,
        args.chunked_prefill_size,
        args.enable_dp_attention,
        args.dp_size,
        args.page_size,
    ) == ("fa3", -1, True, 2, 16)
    with pytest.raises(ServerArgsError, match="--disable-radix-cache: a switch takes no value"):
        ServerArgs.from_flags(["--disable-radix-cache=false"])  # SGLang's argparse refuses it too


def test_defaults_are_sglangs():
    args = ServerArgs()
    assert args.attention_backend is None and args.kv_cache_dtype == "auto" and args.page_size is None
    assert args.hicache_io_backend == "kernel" and args.tp_size == 1 and not args.enable_deterministic_inference


def test_every_flag_problem_is_reported_at_once():
    with pytest.raises(ServerArgsError) as err:
        ServerArgs.from_flags("--attention-backnd fa3 --kv-cache-dtype fp9 --page-size --tp-size x".split())
    text = str(err.value)
    assert "--attention-backnd" in text and "did you mean '--attention-backend'" in text
    assert "--page-size" in text and "expects a value" in text
    assert {p.where for p in err.value.problems} == {
        "--attention-backnd",
        "--kv-cache-dtype",
        "--page-size",
        "--tp-size",
    }


def test_value_errors_are_all_reported():
    with pytest.raises(ServerArgsError) as err:
        ServerArgs.from_flags("--kv-cache-dtype fp9 --tp-size x --attention-backend fa5".split())
    wheres = {p.where for p in err.value.problems}
    assert wheres == {"--kv-cache-dtype", "--tp-size", "--attention-backend"}


def test_args_file_yaml_and_json(tmp_path):
    y = tmp_path / "args.yaml"
    y.write_text("attention-backend: flashinfer\nenable_deterministic_inference: true\n")
    assert ServerArgs.from_file(y).enable_deterministic_inference
    j = tmp_path / "args.json"
    j.write_text('{"page_size": 16, "attention_bakend": "fa3"}')
    with pytest.raises(ServerArgsError, match="did you mean 'attention_backend'"):
        ServerArgs.from_file(j)


def test_from_object_ignores_extra_attributes():
    sglang_like = SimpleNamespace(attention_backend="fa4", page_size=128, model_path="/x", mem_fraction_static=0.8)
    args = ServerArgs.from_object(sglang_like)
    assert (args.attention_backend, args.page_size) == ("fa4", 128)


@pytest.mark.parametrize(
    "obj, needle",
    [
        ({"page_size": 16}, r"ServerArgs\(\*\*mapping\)"),
        (None, "NoneType has none"),
        (SimpleNamespace(model_path="/x"), "none of the server arguments"),
    ],
)
def test_from_object_refuses_what_would_silently_give_the_defaults(obj, needle):
    from attngate.errors import UsageError

    with pytest.raises(UsageError, match=needle):
        ServerArgs.from_object(obj)


def test_frozen():
    with pytest.raises(Exception):
        ServerArgs().page_size = 3  # type: ignore[misc]


def test_platform():
    assert Platform.from_name("SM90").sm_major == 9
    assert Platform.from_name("10.0").gpu_arch == "sm100"
    with pytest.raises(PlatformError, match="--gpu"):
        Platform.from_name("sm95")


class _Driver:
    """A stand-in of libcuda: each call's CUresult, and the capability it writes through the pointer it is given."""

    def __init__(self, capability: tuple[int, int], init: int = 0) -> None:
        self.capability, self.init = capability, init

    def cuInit(self, flags: int) -> int:
        return self.init

    def cuDeviceGet(self, device, ordinal: int) -> int:
        device._obj.value = ordinal
        return 0

    def cuDeviceGetAttribute(self, value, attribute: int, device) -> int:
        value._obj.value = {75: self.capability[0], 76: self.capability[1]}[attribute]
        return 0


@pytest.mark.parametrize(
    "driver, message",
    [
        (OSError("libcuda.so.1: cannot open shared object file"), "libcuda.so.1: cannot open shared object file"),
        (_Driver((9, 0), init=100), "the CUDA driver's cuInit failed: no CUDA device is visible"),
        (_Driver((9, 0), init=999), "the CUDA driver's cuInit failed: CUresult 999"),
    ],
)
def test_platform_detect_without_a_driver_or_device_says_pass_gpu(monkeypatch, driver, message):
    """No driver library, no visible device or a driver error: a PlatformError naming --gpu and the driver's reason."""
    import ctypes

    def load(name: str):
        if isinstance(driver, Exception):
            raise driver
        return driver

    monkeypatch.setattr(ctypes, "CDLL", load)
    with pytest.raises(PlatformError, match="pass --gpu") as err:
        Platform.detect()
    assert message in str(err.value)


@pytest.mark.parametrize(
    "capability, arch", [((8, 6), "sm86"), ((9, 0), "sm90"), ((10, 3), "sm103"), ((12, 0), "sm120")]
)
def test_platform_detect_reads_the_gpu_from_the_driver_and_finds_the_installed_kernel_packages(
    tmp_path, monkeypatch, capability, arch
):
    """The capability comes from the CUDA driver (cuDeviceGetAttribute of device 0; no torch imported), the kernel
    packages from sys.path without importing them (flash_attn.cute needs its flash_attn parent)."""
    import ctypes
    import sys

    for package in ("flashinfer", "flash_attn/cute"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("raise ImportError('never imported by detection')\n")
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("flashinfer", "flash_attn", "flash_attn.cute", "flash_attn_interface", "sgl_kernel"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _Driver(capability))
    platform = Platform.detect()
    assert platform.gpu_arch == arch and platform.kernel_providers == ("flashinfer", "flash_attn.cute")
