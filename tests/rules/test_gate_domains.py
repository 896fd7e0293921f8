"""Each gate's domain, declared once by gate(), refuses a rule that sets a value outside it (with file:line:col) as it
refuses a plan's JSON holding one (tests/plan/test_plan_json.py); the shipped rules stay inside every domain."""

from __future__ import annotations

import pytest
import yaml

from attngate.errors import RulesError
from attngate.facts.choices import KvCacheDtype
from attngate.plan.registry import GATES
from attngate.rules.load import load_rules, parse_rules

HEAD = "version: 1\nrules:\n"


def rule(rule_id: str = "r", **fields) -> str:
    base = {"id": rule_id, "summary": "s", "why": "w", "source": "s", "when": "True", **fields}
    return "  - " + yaml.safe_dump(base, sort_keys=False, width=1000).replace("\n", "\n    ").rstrip() + "\n"


def problems(text: str) -> list[str]:
    with pytest.raises(RulesError) as err:
        parse_rules(text, "rules.yaml")
    return [str(p) for p in err.value.problems]


def test_the_shipped_rules_load_inside_every_gates_domain():
    rules = load_rules(None)
    for r in rules.rules:
        for name, value in r.sets.items():
            assert GATES[name].type.accepts(value), (r.id, name, value)


def test_kv_cache_dtype_takes_server_args_choices():
    assert GATES["common.kv_cache_dtype"].type.choices == KvCacheDtype.__args__


@pytest.mark.parametrize(
    "gate, value, expected",
    [
        (
            "common.kv_cache_dtype",
            "rm -rf /",
            "rules.yaml:9:30: common.kv_cache_dtype is one of ['auto', 'bf16', 'bfloat16', 'fp8_e4m3', 'fp8_e5m2', "
            "'fp4_e2m1', 'nvfp4', 'fp4_mx_block16', 'mxfp8'], got 'rm -rf /'",
        ),
        ("common.page_size", 10**100, f"rules.yaml:9:25: common.page_size is int in [1, 65536], got {10**100}"),
        ("common.page_size", 65537, "rules.yaml:9:25: common.page_size is int in [1, 65536], got 65537"),
        ("fa.num_splits", 257, "rules.yaml:9:22: fa.num_splits is int in [0, 256], got 257"),
        ("common.attn_tp_size", 0, "rules.yaml:9:28: common.attn_tp_size is int in [1, 65536], got 0"),
        ("flashinfer.workspace_size_mb", 1 << 21, "flashinfer.workspace_size_mb is int in [1, 1048576], got 2097152"),
        ("flashinfer.decode_fixed_split_size", -1, "flashinfer.decode_fixed_split_size is int in [1, 1099511627776]"),
        ("fa.kv_extent", "everything", "fa.kv_extent is one of ['prefix_plus_new', 'prefix', 'none'], got"),
        ("flashinfer.wrapper_index", 2, "flashinfer.wrapper_index is int in [0, 1], got 2"),
        ("common.page_size", True, "common.page_size is int in [1, 65536], got True"),
        ("fa.skip_kv_cache", 1, "fa.skip_kv_cache is bool, got 1"),
    ],
)
def test_a_rule_setting_a_value_outside_a_gates_domain_is_refused_where_it_is(gate, value, expected):
    found = problems(HEAD + rule(set={gate: value}))
    assert len(found) == 1 and found[0].startswith("rules.yaml:9:") and expected in found[0], found


def test_every_out_of_domain_value_of_a_file_in_one_run():
    text = HEAD + rule("a", set={"common.kv_cache_dtype": "rm -rf /"}) + rule("b", set={"fa.num_splits": 1000})
    found = problems(text)
    assert [p.split(": ")[0] for p in found] == ["rules.yaml:9:30", "rules.yaml:16:22"], found


@pytest.mark.parametrize(
    "when, expected",
    [
        ("common.page_size == 0", "rules.yaml:7:60: rule 'r': common.page_size is int in [1, 65536], compared with 0"),
        ("fa.num_splits in (1, 300)", "rules.yaml:7:61: rule 'r': fa.num_splits is int in [0, 256], compared with 300"),
        ("common.kv_cache_dtype == 'fp9'", "rules.yaml:7:65: rule 'r': 'fp9' is not a value of common.kv_cache_dtype"),
    ],
)
def test_a_condition_comparing_a_gate_with_a_value_outside_its_domain_is_refused(when, expected):
    found = problems(HEAD + rule(when=f"forward_mode == 'decode' and {when}", set={"fa.kv_extent": "prefix"}))
    assert any(expected in p for p in found), found
