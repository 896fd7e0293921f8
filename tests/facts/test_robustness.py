"""Bad input of every class found by the robustness sweep (issue 14): a clean error of the project's own
types naming the file:line:col, flag or key, within bounded time; nothing accepted silently."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attngate import ModelFacts, ServerArgs
from attngate.cli import app
from attngate.errors import AttngateError, ModelConfigError, PlanLoadError, RulesError, ServerArgsError
from attngate.plan.schema import Plan
from attngate.rules.load import load_rules, parse_rules
from tests.support.helpers import MODELS, SERVER_ARGS

LLAMA = MODELS / "Llama-3.1-8B.json"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh")
)


def _cli(*args: str):
    start = time.perf_counter()
    result = CliRunner().invoke(app, list(args))
    assert time.perf_counter() - start < 10, args
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("bomb.yaml", BOMB, "after alias expansion"),
        ("selfref.yaml", "x: &a [*a]\n", "nested more than"),
        ("deep.yaml", "x: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
        ("timestamp.yaml", "rules:\n  - id: t\n    summary: !!timestamp nope\n", "bad scalar 'nope'"),
        ("latin1.yaml", "rules: caf\xe9\n", "not UTF-8"),
    ],
)
def test_bad_rules_files_are_clean_errors(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    result = _cli("lint", str(path))
    assert result.exit_code == 2 and expected in result.output and str(path) in result.output
    with pytest.raises(RulesError, match=expected):
        load_rules(path)


def test_a_directory_or_missing_file_is_a_clean_error(tmp_path):
    assert "is a directory" in _cli("lint", str(tmp_path)).output
    with pytest.raises(ModelConfigError, match="cannot read"):
        ModelFacts.from_hf_config(tmp_path / "nope.json")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_device_is_refused_before_it_is_read():
    result = _cli("explain", "--model", "/dev/zero", "--gpu", "sm90")
    assert result.exit_code == 2 and "/dev/zero: is not a regular file" in result.output


@pytest.mark.parametrize(
    "command",
    [
        ["explain", "--model", "{fifo}", "--gpu", "sm90"],
        ["lint", "{fifo}"],
        ["explain", "--model", "{model}", "--gpu", "sm90", "--args-file", "{fifo}"],
    ],
)
def test_a_fifo_is_refused_at_once_instead_of_blocking_until_a_writer_comes(tmp_path, command):
    import os

    from tests.support.helpers import MODELS

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    start = time.monotonic()
    result = _cli(*[a.format(fifo=fifo, model=MODELS / "Llama-3.1-8B.json") for a in command])
    assert result.exit_code == 2 and "is not a regular file (a FIFO, device or socket)" in result.output, result.output
    assert time.monotonic() - start < 10


def test_a_path_component_over_the_name_limit_is_a_clean_error():
    result = _cli("explain", "--model", "/tmp/" + "x" * 300 + ".json", "--gpu", "sm90")
    assert result.exit_code == 2 and "cannot read the config.json" in result.output, result.output


def test_a_nul_byte_in_a_path_is_a_clean_error():
    with pytest.raises(ModelConfigError, match="cannot read the config.json: embedded null byte"):
        ModelFacts.from_hf_config("conf\x00ig.json")
    with pytest.raises(ServerArgsError, match="embedded null byte"):
        ServerArgs.from_file("args\x00.yaml")


@pytest.mark.parametrize(
    "edit, expected",
    [
        ({"num_hidden_layers": 10**9}, "num_hidden_layers: 1000000000 is beyond any real model"),
        ({"num_attention_heads": 1e30}, "num_attention_heads: must be a positive integer"),
        ({"torch_dtype": 5}, "torch_dtype: must be a dtype name"),
        ({"layer_types": [["x"]] * 32}, "layer_types[0]: unsupported value ['x']"),
        (
            {"hybrid_override_pattern": ["*"] * 32},
            "hybrid_override_pattern: must be a string of characters from '*M-E'",
        ),
        (
            {"sliding_window": 4096, "sliding_window_pattern": ""},
            "sliding_window_pattern: must be an integer or a string",
        ),
        (
            {"rope_theta": float("nan"), "attn_logit_softcapping": float("inf")},
            "attn_logit_softcapping: must be a finite number",
        ),
    ],
)
def test_config_values_are_checked_before_use(tmp_path, edit, expected):
    raw = {**json.loads(LLAMA.read_text()), **edit}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ModelConfigError) as err:
        ModelFacts.from_hf_config(path)
    assert expected in str(err.value)


def test_every_problem_of_a_config_at_once(tmp_path):
    """Shape errors of one config come back together, each naming its key; a config that is not an object is refused."""
    deepseek = json.loads((MODELS / "DeepSeek-V2-Lite.json").read_text())
    del deepseek["qk_rope_head_dim"]
    deepseek.update(architectures="DeepseekV2ForCausalLM", num_key_value_heads=5)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(deepseek))
    with pytest.raises(ModelConfigError) as err:
        ModelFacts.from_hf_config(path)
    text = str(err.value)
    for expected in (
        "architectures: must be a list of strings",
        "qk_rope_head_dim: missing (required with kv_lora_rank)",
        "num_key_value_heads: 5 does not divide num_attention_heads=16",
    ):
        assert expected in text, text
    llama = json.loads(LLAMA.read_text())
    for edit, expected in (
        ({"head_dim": None, "hidden_size": 4095}, "hidden_size: 4095 is not divisible by num_attention_heads=32"),
        (
            {"cross_attention_layers": [3, 99]},
            "cross_attention_layers: must list layer indices below num_hidden_layers=32",
        ),
        (
            {"attention_chunk_size": 8192, "no_rope_layers": [1, 0]},
            "no_rope_layers: must give num_hidden_layers=32 flags, got 2",
        ),
    ):
        path.write_text(json.dumps({**llama, **edit}))
        with pytest.raises(ModelConfigError, match=re.escape(expected)):
            ModelFacts.from_hf_config(path)
    path.write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match="config.json must hold a JSON object"):
        ModelFacts.from_hf_config(path)


def test_qwen2_window_starts_at_max_window_layers():
    """Qwen2 with use_sliding_window: layers below max_window_layers are full, the rest slide (transformers' layer_types)."""
    raw = {
        **json.loads((MODELS / "Qwen2.5-7B-Instruct.json").read_text()),
        "use_sliding_window": True,
        "max_window_layers": 21,
    }
    raw.pop("layer_types", None)
    facts = ModelFacts.from_hf_dict(raw)
    assert [k.value for k in facts.layer_kinds] == ["full"] * 21 + ["sliding_window"] * (raw["num_hidden_layers"] - 21)
    assert facts.sliding_window == raw["sliding_window"]


def test_explicit_null_means_the_default_and_a_deep_config_is_refused(tmp_path):
    raw = {**json.loads(LLAMA.read_text()), "num_key_value_heads": None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert ModelFacts.from_hf_config(tmp_path).num_key_value_heads == raw["num_attention_heads"]
    (tmp_path / "config.json").write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(ModelConfigError, match="nested more than"):
        ModelFacts.from_hf_config(tmp_path)


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("dup.yaml", "page_size: 16\npage_size: 8\n", "dup.yaml:2:1: duplicate key 'page_size'"),
        ("spelled.yaml", "page_size: 16\npage-size: 8\n", "dup"),
        ("dup.json", '{"page_size": 16, "page_size": 8}', "duplicate key 'page_size'"),
        ("bomb.yaml", BOMB, "after alias expansion"),
        ("big.yaml", "page_size: 100000000000000000000\n", "page_size"),
        # YAML reads hex, binary and base-60 integers of any length: past 4300 decimal digits repr() itself raises
        ("hex.yaml", "tp_size: 0x" + "f" * 5000 + "\n", "hex.yaml:1:10: an integer of 20000 bits"),
        ("bin.yaml", "tp_size: 0b" + "1" * 20000 + "\n", "an integer of 20000 bits"),
        ("base60.yaml", "tp_size: 1" + ":59" * 3000 + "\n", "bits, past any value attngate reads"),
    ],
)
def test_bad_args_files_are_clean_errors(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ServerArgsError) as err:
        ServerArgs.from_file(path)
    message = str(err.value)
    assert (expected in message) or (expected == "dup" and "sets page_size again" in message), message


def test_a_flag_given_twice_warns_naming_both_values():
    result = _cli(
        "explain", "--model", str(LLAMA), "--gpu", "sm90", "--page-size", "16", "--page-size", "32", "--format", "json"
    )
    assert result.exit_code == 0 and "--page-size: given twice, '16' then '32'; the last wins" in result.output
    assert _cli("explain", "--model", str(LLAMA), "--gpu", "sm90", "--page-size", "1" + "0" * 20).exit_code == 2


def test_an_adjusted_value_out_of_its_arguments_bounds_is_refused_naming_the_rule():
    """A value an adjust rule reads from a fact ({from: FACT}) is checked against the argument's type before it is
    applied: NGRAM's steps (draft tokens // breadth) can exceed speculative_num_steps' bound."""
    result = _cli(
        "explain",
        "--model",
        str(LLAMA),
        "--gpu",
        "sm90",
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-num-draft-tokens",
        "4096",
        "--speculative-ngram-max-bfs-breadth",
        "1",
    )
    assert result.exit_code == 1, result.output  # a refused configuration, as a forbid rule's
    text = " ".join(result.output.split())
    assert (
        "spec.ngram-steps-from-draft-tokens: sets speculative_num_steps to 4096 (from speculative_ngram_num_steps)"
        in text
    )
    assert "speculative_num_steps is int in [0, 1024] or None" in text


def test_rule_text_is_never_read_as_markup(tmp_path):
    text = load_rules().filename and (MODELS.parents[1] / "rules.yaml").read_text()
    text = text.replace(
        "summary: FlashInfer prefill (ragged and paged wrappers) runs its SM90 (fa3) kernels",
        'summary: "[/] [bold]failed backends: [flashinfer]" # ',
    )
    text = text.replace(
        "message: FlashInfer MLA only supports topk=1 for speculative decoding.",
        'message: "[/] failed backends: [flashinfer]"',
    )
    (tmp_path / "rules.yaml").write_text(text)
    args = (
        "explain",
        "--model",
        str(MODELS / "DeepSeek-V2-Lite.json"),
        "--gpu",
        "sm90",
        "--rules",
        str(tmp_path / "rules.yaml"),
        "--attention-backend",
        "flashinfer",
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-eagle-topk",
        "2",
        "--speculative-num-steps",
        "2",
        "--speculative-num-draft-tokens",
        "4",
    )
    result = _cli(*args)
    assert result.exit_code == 1 and "[/] failed backends: [flashinfer]" in result.output


def test_an_integer_too_long_to_quote_in_decimal_is_named_by_its_size():
    with pytest.raises(ServerArgsError, match=r"tp_size: .* \(got <an integer of 20001 bits>\)"):
        ServerArgs(tp_size=1 << 20000)
    with pytest.raises(RulesError, match=r"r.yaml:3:\d+: an integer of 20000 bits"):
        parse_rules(
            "version: 1\nrules:\n  - {id: a, summary: s, why: w, source: s, when: use_mla, set: {fa.num_splits: 0x"
            + "f" * 5000
            + "}}\n",
            "r.yaml",
        )


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda m: __import__("attngate").Platform.from_name("sm90", kernels=[None]), "--kernels: unknown kernel"),
        (lambda m: ServerArgs.from_file(None), "path: takes str or Path, not None"),
        (lambda m: m.attention_position(1.5), "layer_idx: takes an int"),
        (lambda m: m.attention_position(True), "not bool"),
        (lambda m: m.shape("no-such-kind"), "'no-such-kind' is no layer kind"),
        (
            lambda m: __import__("attngate").resolve(
                ServerArgs(), m, __import__("attngate").Platform.from_name("sm90"), allow_known_failures=[1]
            ),
            "allow_known_failures: 1 is not a known_failure rule",
        ),
    ],
)
def test_an_element_or_argument_of_the_wrong_type_is_the_projects_own_error(call, needle):
    with pytest.raises(AttngateError) as err:
        call(ModelFacts.from_hf_config(LLAMA))
    assert needle in str(err.value)


def test_library_objects_validate_on_construction_and_copy():
    with pytest.raises(ServerArgsError, match="ServerArgs.page_size"):
        ServerArgs(page_size=0)
    facts = ModelFacts.from_hf_config(MODELS / "DeepSeek-V2-Lite.json")
    with pytest.raises(ModelConfigError, match="kv_lora_rank"):
        facts.model_copy(update={"kv_lora_rank": None})
    with pytest.raises(ModelConfigError, match="num_key_value_heads"):
        ModelFacts.from_hf_config(LLAMA).model_copy(update={"num_key_value_heads": 0})
    plan = Plan.from_json(Plan(prefill_backend="fa3", decode_backend="fa3").to_json())
    with pytest.raises(PlanLoadError):
        plan.model_copy(update={"decode_backend": "nope"})
    with pytest.raises(PlanLoadError, match="nested more than"):
        Plan.from_json("[" * 5000 + "]" * 5000)


def test_library_calls_with_wrong_arguments_name_every_parameter():
    """A dict where ServerArgs goes, one string where a list goes: a UsageError naming each parameter, not an
    AttributeError from deep inside resolve()."""
    from attngate import Platform, resolve
    from attngate.errors import UsageError

    with pytest.raises(UsageError) as err:
        resolve(
            {"page_size": 16}, None, Platform.from_name("sm90"), "rules.yaml", allow_known_failures="fa3.eagle-tree"
        )
    assert [p.where for p in err.value.problems] == ["server_args", "model", "rules", "allow_known_failures"]
    assert isinstance(err.value, TypeError) and isinstance(err.value, AttngateError)
    with pytest.raises(UsageError, match="kernels: takes list or tuple or None, not str"):
        Platform.from_name("sm90", kernels="flashinfer")
    with pytest.raises(UsageError, match="from_hf_dict"):
        ModelFacts.from_hf_config({"model_type": "llama"})
    with pytest.raises(UsageError, match="parse_rules"):
        load_rules(3)
    plan = Plan(prefill_backend="fa3", decode_backend="fa3")
    with pytest.raises(UsageError, match="(?s)no ForwardMode 'decod'.*help: did you mean 'decode'"):
        plan.mode("decod")
    with pytest.raises(ValueError, match="no LayerKind 'window'"):
        plan.layer("window")


@settings(max_examples=60, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=30,
    )
)
def test_fuzz_config_reader(value):
    """Any JSON value under any config key: a config or a ModelConfigError, nothing else."""
    raw = json.loads(LLAMA.read_text())
    for key in (
        "num_key_value_heads",
        "layer_types",
        "model_type",
        "sliding_window",
        "text_config",
        "torch_dtype",
        "hybrid_override_pattern",
        "sliding_window_pattern",
        "index_topk",
        "use_bidirectional_attention",
    ):
        try:
            ModelFacts.from_hf_dict({**raw, key: value})
        except ModelConfigError:
            pass


@settings(max_examples=60, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("abc_[]{}&*!:-#'\" \n0123456789.")), max_size=200))
def test_fuzz_rules_loader_and_args_files(text):
    """Arbitrary YAML-ish text: parsed or a RulesError / ServerArgsError, in bounded time."""
    start = time.perf_counter()
    try:
        parse_rules(text, "fuzz.yaml")
    except RulesError:
        pass
    assert time.perf_counter() - start < 5  # a bound against blow-ups, loose for a loaded host


@settings(max_examples=60, deadline=2000)
@given(
    st.lists(
        st.sampled_from(
            [
                "--page-size",
                "--page-size=0",
                "16",
                "x",
                "--attention-backend",
                "fa3",
                "--enable-dp-attention",
                "--enable-dp-attention=maybe",
                "--dp-size",
                "-1",
                "--nope",
                "None",
            ]
        ),
        max_size=8,
    )
)
def test_fuzz_flags(argv):
    try:
        ServerArgs.from_flags(argv)
    except ServerArgsError:
        pass


@settings(max_examples=40, deadline=2000)
@given(
    st.lists(
        st.sampled_from(
            list('ab_.()=<>!01 "')
            + [" and ", " or ", " not ", " in ", "use_mla", "page_size", "context_length", "fa.num_splits", "not " * 40]
        ),
        max_size=30,
    ).map("".join)
)
def test_fuzz_condition_compiler(expression):
    """A rule's ``when`` of any text: loaded, or a RulesError naming where."""
    text = (
        f"version: 1\nrules:\n  - id: fuzz\n    summary: s\n    when: {json.dumps(expression)}\n"
        "    set: {fa.num_splits: 1}\n    why: w\n    source: s\n"
    )
    try:
        parse_rules(text, "fuzz.yaml")
    except AttngateError as err:
        assert all(p.where for p in err.problems)


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("not " * 1000 + "use_mla", "nested more than"),
        ("not " * 5000 + "use_mla", "longer than 4096 characters"),
        ("context_length > 4", "context_length may be None"),
    ],
)
def test_conditions_that_could_raise_later_are_refused_when_the_rules_load(expression, expected):
    text = (
        f"version: 1\nrules:\n  - id: deep\n    summary: s\n    when: {json.dumps(expression)}\n"
        "    set: {fa.num_splits: 1}\n    why: w\n    source: s\n"
    )
    with pytest.raises(RulesError, match=expected) as err:
        parse_rules(text, "deep.yaml")
    assert "deep.yaml:5:" in str(err.value)


def test_a_plan_changed_in_place_is_refused_by_every_backend():
    torch = pytest.importorskip("torch")
    from attngate import ModelFacts, Platform, resolve
    from attngate.backends.reference import ReferenceBackend
    from attngate.backends.runtime.kv_cache import MHATokenToKVPool
    from attngate.backends.runtime.layer import layers_from_model

    facts = ModelFacts.from_hf_config(LLAMA)
    plan = resolve(ServerArgs(), facts, Platform.from_name("sm90")).plan
    object.__setattr__(plan.common, "page_size", 64)  # frozen refuses plan.common.page_size = 64, not this
    with pytest.raises(PlanLoadError, match="changed after it was validated"):
        ReferenceBackend(
            plan, MHATokenToKVPool(64, 1, 1, 8, 128), torch.zeros(1, 64, dtype=torch.int32), layers_from_model(facts)
        )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    args=SERVER_ARGS,
    model=st.sampled_from(sorted(p.stem for p in MODELS.glob("*.json"))),
    gpu=st.sampled_from(["sm80", "sm90", "sm100", "sm120"]),
)
def test_any_server_arguments_resolve_and_explain_or_fail_cleanly(args, model, gpu):
    """Any combination of SGLang's server arguments, on any example model and GPU: a plan whose every gate explains
    (the explanation evaluates each rule's conditions conjunct by conjunct), or an attngate error; nothing else."""
    from attngate import PlanError, Platform, resolve

    try:
        server_args = ServerArgs(**args)
    except ServerArgsError:
        event("server arguments refused")
        return
    try:
        res = resolve(server_args, ModelFacts.from_hf_config(MODELS / f"{model}.json"), Platform.from_name(gpu))
    except PlanError:
        event("configuration refused")
        return
    event("resolved and explained")
    why = res.explanation
    assert set(why.gates) and set(why.modes) and set(why.layers)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    args=SERVER_ARGS,
    model=st.sampled_from(sorted(p.stem for p in MODELS.glob("*.json"))),
    gpu=st.sampled_from(["sm80", "sm90", "sm100"]),
    view=st.sampled_from([(), ("--all",), ("--format", "json")]),
)
def test_explain_prints_any_server_arguments_or_says_why_not(tmp_path_factory, args, model, gpu, view):
    """The CLI over any mix of server arguments (as an args file): exit 0 or 1 with the explained plan or every
    reason, 2 for arguments ServerArgs refuses; never a traceback, in every view."""
    import yaml

    path = tmp_path_factory.mktemp("args") / "args.yaml"
    path.write_text(yaml.safe_dump(args))
    result = CliRunner().invoke(
        app, ["explain", "--model", str(MODELS / f"{model}.json"), "--gpu", gpu, "--args-file", str(path), *view]
    )
    event(f"exit {result.exit_code}")
    assert result.exit_code in (0, 1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "argv, needle",
    [
        ("--tp-size 2", "not a str; split it"),
        (["--tp-size", 2], "argv[1]: 2 is a int, not a string"),
        (None, "not a NoneType"),
    ],
)
def test_from_flags_names_a_bad_argv_instead_of_a_raw_type_error(argv, needle):
    from attngate import ServerArgs
    from attngate.errors import UsageError

    with pytest.raises(UsageError) as err:
        ServerArgs.from_flags(argv)
    assert needle in str(err.value)


def test_from_object_names_the_attribute_whose_access_raised():
    from attngate import ServerArgs
    from attngate.errors import UsageError

    class Broken:
        attention_backend = "fa3"

        @property
        def page_size(self):
            raise RuntimeError("not resolved yet")

    with pytest.raises(UsageError) as err:
        ServerArgs.from_object(Broken())
    assert "Broken.page_size: reading it raised RuntimeError: not resolved yet" in str(err.value)


@pytest.mark.parametrize(
    "build, needle",
    [
        (lambda: ServerArgs.from_flags(["--tp-size", "2.0"]), "--tp-size: takes an integer (got '2.0')"),
        (lambda: ServerArgs(tp_size=True), "ServerArgs.tp_size: takes an integer (got True)"),
        (lambda: ServerArgs(page_size=16.0), "ServerArgs.page_size: takes an integer (got 16.0)"),
    ],
)
def test_an_integer_argument_takes_no_bool_float_or_decimal_point(build, needle):
    with pytest.raises(ServerArgsError) as err:
        build()
    assert needle in str(err.value)
