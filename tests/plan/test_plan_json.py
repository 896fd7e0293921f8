"""A plan loads only as a resolution made it (tracker issue 53): Plan.from_json over mutations of real plans' JSON.

The property: whatever a mutation does to a resolved plan's JSON (drop a key, null or edit the fingerprint, edit a
gate, add an unknown key, repeat a key, values outside a gate's domain or of another type, reordered keys, cut text),
from_json returns a plan equal to the original exactly where the mutated text says what the original said, and
otherwise raises PlanLoadError: never another exception, never another plan, within a time bound."""

from __future__ import annotations

import functools
import json
import time

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from attngate import ModelFacts, Plan, Platform, ServerArgs, resolve
from attngate.errors import PlanLoadError
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.plan.load import MAX_PROBLEMS
from attngate.plan.registry import GATES
from tests.support.helpers import MODELS

#: (server args, model, GPU) of the plans the mutations start from: MHA, sliding window, MLA, encoder-decoder; planned
#: for attngate's own backends (runs_sglang false), whose FlashInfer plans gemma-2's soft-cap and window, where SGLang's
#: drops them (known.flashinfer-softcap-planned-uncapped, known.flashinfer-ragged-prefill-drops-window)
CASES = [
    ({}, "Llama-3.1-8B", "sm90"),
    ({"attention_backend": "flashinfer", "enable_deterministic_inference": True}, "gemma-2-9b", "sm90"),
    ({}, "DeepSeek-V2-Lite", "sm100"),
    ({"attention_backend": "fa3", "page_size": 16}, "gpt-oss-20b", "sm90"),
]


@functools.cache
def plan(case: int) -> Plan:
    args, name, gpu = CASES[case]
    platform = Platform.from_name(gpu, runs_sglang=False)
    return resolve(ServerArgs(**args), ModelFacts.from_hf_config(MODELS / f"{name}.json"), platform).plan


def body(case: int = 0) -> dict:
    return json.loads(plan(case).to_json())


def refused(text: str) -> list[str]:
    with pytest.raises(PlanLoadError) as err:
        Plan.from_json(text)
    return [str(p) for p in err.value.problems]


# ---- the property --------------------------------------------------------------------------------------------------


class Obj(list):
    """A JSON object as its (key, value) pairs, in order: a key may appear twice."""


def pairs_of(value):
    if isinstance(value, dict):
        return Obj([k, pairs_of(v)] for k, v in value.items())
    return [pairs_of(v) for v in value] if isinstance(value, list) else value


def dump(value, indent: int | None) -> str:
    if isinstance(value, Obj):
        sep = "\n" + " " * indent if indent else ""
        return "{" + ",".join(f"{sep}{json.dumps(k)}: {dump(v, indent)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v, indent) for v in value) + "]"
    return json.dumps(value)


def objects(value, out: list) -> list:
    if isinstance(value, Obj):
        out.append(value)
        for _, v in value:
            objects(v, out)
    elif isinstance(value, list):
        for v in value:
            objects(v, out)
    return out


_IN_DOMAIN = [0, 1, 2, 7, 16, 64, 128, 256, 65536, True, False, None, "auto", "fp8_e4m3", "fa3", "triton", "decode"]
_OUT_OF_DOMAIN = [-1, 257, 1 << 16 | 1, 10**100, -(10**30), 1.0, 0.5, "rm -rf /", "", "FA3", "1", "true", "null"]
VALUES = st.one_of(
    st.sampled_from(_IN_DOMAIN + _OUT_OF_DOMAIN),
    st.integers(),
    st.text(max_size=6),
    st.floats(allow_nan=False),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=4), st.booleans(), max_size=2).map(pairs_of),
)
_HEX = st.text("0123456789abcdefABCDEF", min_size=63, max_size=65)
_WHERE = st.integers(0, 10**6)  # an object of the tree, a pair of it: taken modulo their counts
NO_OP = st.one_of(
    st.tuples(st.just("reorder"), _WHERE, st.randoms(use_true_random=False)),
    st.tuples(st.just("set"), _WHERE, _WHERE, st.just("same")),
)
CHANGE = st.one_of(
    st.tuples(st.just("drop"), _WHERE, _WHERE),
    st.tuples(st.just("set"), _WHERE, _WHERE, VALUES),
    st.tuples(st.just("add"), _WHERE, st.text(max_size=12), VALUES),
    st.tuples(st.just("repeat"), _WHERE, _WHERE, VALUES | st.just("same")),
    st.tuples(st.just("rename"), _WHERE, _WHERE, st.text(max_size=12)),
    st.tuples(st.just("fingerprint"), st.sampled_from([None, "", 0, "same-upper"]) | _HEX),
    st.tuples(st.just("no fingerprint")),
)
MUTATION = NO_OP | CHANGE


def mutate(tree: Obj, mutation: tuple) -> None:
    kind, *args = mutation
    if kind in ("fingerprint", "no fingerprint"):
        for i, (key, value) in enumerate(tree):
            if key == "fingerprint":
                if kind == "no fingerprint":
                    del tree[i]
                else:
                    tree[i][1] = value.upper() if args[0] == "same-upper" and isinstance(value, str) else args[0]
                return
        return
    every = objects(tree, [])
    target = every[args[0] % len(every)]
    if kind == "add":
        target.append([args[1], args[2]])
        return
    if kind == "reorder":
        args[1].shuffle(target)
        return
    if not target:
        return
    i = args[1] % len(target)
    if kind == "drop":
        del target[i]
    elif kind == "set" and args[2] != "same":
        target[i][1] = args[2]
    elif kind == "repeat":
        target.insert(i, [target[i][0], target[i][1] if args[2] == "same" else args[2]])
    elif kind == "rename":
        target[i][0] = args[2]


def says(text: str):
    """What ``text`` says, canonically (sort_keys; ``1``, ``1.0`` and ``true`` apart); None where it holds a key twice
    in one object or is no JSON."""
    repeated = []

    def pairs(items):
        keys = [k for k, _ in items]
        repeated.extend(k for k in set(keys) if keys.count(k) > 1)
        return dict(items)

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except ValueError:
        return None
    return None if repeated else json.dumps(data, sort_keys=True)


@settings(max_examples=300, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.integers(0, len(CASES) - 1),
    mutations=st.lists(MUTATION, min_size=1, max_size=3),
    indent=st.sampled_from([None, 0, 2]),
    cut=st.sampled_from([None] * 4) | st.integers(0, 10**6),
)
def test_plan_json_mutation(case, mutations, indent, cut):
    original = plan(case)
    tree = pairs_of(json.loads(original.to_json()))
    for mutation in mutations:
        mutate(tree, mutation)
    text = dump(tree, indent)
    if cut is not None:
        text = text[: cut % (len(text) + 1)]
    start = time.perf_counter()
    try:
        loaded = Plan.from_json(text)
    except PlanLoadError as err:
        event("refused")
        assert err.problems and all(p.where for p in err.problems)
        assert says(text) != says(original.to_json()), "the JSON says what the plan's does, yet it was refused"
    else:
        event("loaded")
        assert says(text) == says(original.to_json()), "a JSON that says something else loaded"
        assert loaded == original and loaded.fingerprint == original.fingerprint
    assert time.perf_counter() - start < 5.0  # a bound against hangs, loose for a loaded 2-core CI host


# ---- each named case -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_resolved_plan_round_trips(case):
    again = Plan.from_json(plan(case).to_json())
    assert again == plan(case) and again.fingerprint == plan(case).fingerprint
    assert Plan.from_json(plan(case).to_json(indent=None)) == plan(case)


@pytest.mark.parametrize("fingerprint", [None, "absent", "", 0, "ab" * 32 + "0", "AB" * 32, "z" * 64])
def test_an_edited_gate_never_loads_past_a_missing_or_malformed_fingerprint(fingerprint):
    data = body()
    data["fa"]["num_splits"] = 7
    if fingerprint == "absent":
        del data["fingerprint"]
    else:
        data["fingerprint"] = fingerprint
    found = refused(json.dumps(data))
    assert len(found) == 1 and found[0].startswith("$.fingerprint: "), found


def test_an_edited_gate_under_the_original_fingerprint_does_not_match():
    data = body()
    data["fa"]["num_splits"] = 7
    (found,) = refused(json.dumps(data))
    assert found.startswith(f"$.fingerprint: {data['fingerprint']} does not match the plan's content")
    data["fingerprint"] = data["fingerprint"].upper()  # not the digest as written, though the same number
    assert refused(json.dumps(data))[0].startswith("$.fingerprint: ")


def test_a_plan_of_two_keys_lists_every_key_it_lacks():
    found = refused('{"prefill_backend": "fa3", "decode_backend": "fa3"}')
    missing = [p.split(":")[0] for p in found]
    assert missing == ["$.fa", "$.flashinfer", "$.common", "$.modes", "$.layers", "$.fingerprint"]
    assert all("missing" in p for p in found)


def test_every_gate_is_required_at_every_depth():
    data = body()
    del data["modes"]["decode"]["fa"]["kv_extent"], data["layers"]["sliding_window"]["common"]
    del data["flashinfer"]["decode_fixed_split_size"], data["modes"]["idle"]
    found = refused(json.dumps(data))
    assert {p.split(":")[0] for p in found} == {
        "$.modes.decode.fa.kv_extent",
        "$.modes.idle",
        "$.layers.sliding_window.common",
        "$.flashinfer.decode_fixed_split_size",
    }


@pytest.mark.parametrize("same", [False, True])
def test_a_key_twice_in_one_object_is_refused_at_every_depth(same):
    text = plan(0).to_json()
    top = json.dumps(json.loads(text)["decode_backend"])
    twice = text.replace(
        '"decode_backend": ', f'"decode_backend": {top if same else json.dumps("triton")}, "decode_backend": ', 1
    )
    deep = twice.replace('"kv_extent": ', f'"kv_extent": {json.dumps("none")}, "kv_extent": ', 1)
    found = refused(deep)
    assert found[0].startswith("$.decode_backend: appears more than once")
    assert any(p.startswith("$.modes.") and ".fa.kv_extent: appears more than once" in p for p in found), found


def test_unknown_keys_are_refused_with_their_path():
    data = body()
    data["fa"]["num_split"] = 1
    data["modes"]["decode"]["common"]["x y"] = None
    data["extra"] = {}
    found = refused(json.dumps(data))
    assert "$.fa.num_split: unknown key\n    help: did you mean 'num_splits'?" in found
    assert '$.modes.decode.common["x y"]: unknown key' in found and "$.extra: unknown key" in found


def test_values_outside_a_gates_domain_or_type_are_each_refused_at_once():
    data = body()
    common = data["common"]
    common["kv_cache_dtype"], common["page_size"], common["cuda_graph"] = "rm -rf /", 10**100, 1
    data["fa"]["num_splits"], data["flashinfer"]["workspace_size_mb"] = True, 1.0
    data["modes"]["decode"]["fa"]["kv_extent"], data["layers"]["full"] = "all", []
    data["prefill_backend"] = "fa33"
    found = refused(json.dumps(data))
    where = {p.split(": ")[0]: p for p in found}
    assert set(where) == {
        "$.common.kv_cache_dtype",
        "$.common.page_size",
        "$.common.cuda_graph",
        "$.fa.num_splits",
        "$.flashinfer.workspace_size_mb",
        "$.modes.decode.fa.kv_extent",
        "$.layers.full",
        "$.prefill_backend",
    }, found
    assert 'got the string "rm -rf /"' in where["$.common.kv_cache_dtype"]
    assert "int in [1, 65536]" in where["$.common.page_size"]
    assert "help: did you mean 'fa3'?" in where["$.prefill_backend"]
    assert "takes a JSON object" in where["$.layers.full"]


def _out_of_domain(spec) -> list:
    t = spec.type
    wrong_type = "x" if t.base in ("bool", "int") else 1
    out = [wrong_type, 1.5] + ([] if t.optional else [None])
    out += [t.maximum + 1] if t.maximum is not None else []
    out += [t.minimum - 1] if t.minimum is not None else []
    out += ["not-a-choice"] if t.choices else []
    out += [1] if t.base == "bool" else []
    return out


def _shown(value) -> str:
    return f"the string {json.dumps(value)}" if isinstance(value, str) else json.dumps(value)


def _path(spec) -> list[list[str]]:
    rows = {
        "global": [[]],
        "mode": [["modes", m.value] for m in ForwardMode],
        "layer": [["layers", k.value] for k in LayerKind],
    }
    return [row + [spec.group, spec.field] for row in rows[spec.scope]]


@pytest.mark.parametrize("name", sorted(GATES))
def test_every_gate_refuses_each_value_outside_its_declared_domain(name):
    """The domain of gate() declaration, as the registry holds it, is what a plan's JSON is held to."""
    spec = GATES[name]
    for value in _out_of_domain(spec):
        data = body()
        path = _path(spec)[-1]
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        where = "$." + ".".join(path)
        assert refused(json.dumps(data)) == [f"{where}: takes {spec.type.describe()}, got {_shown(value)}"], value


def test_the_text_must_be_one_json_object():
    assert refused("[]") == [
        f"$: takes a JSON object (of {', '.join([*Plan.model_fields, 'fingerprint'])}), got an array"
    ]
    assert refused("")[0].startswith("plan:1:1: not JSON")
    assert refused("[" * 100 + "]" * 100) == ["$: nested more than 64 levels deep"]
    assert "not JSON" in refused('{"a": ' + "1" * 5000 + "}")[0]


def test_a_text_of_many_problems_is_refused_quickly_with_a_bounded_list():
    data = body()
    text = json.dumps(data)[:-1] + "".join(f', "k{i}": {i}' for i in range(200_000)) + "}"
    start = time.perf_counter()
    found = refused(text)
    assert time.perf_counter() - start < 5.0
    assert len(found) == MAX_PROBLEMS + 1 and found[-1] == "$: and 100000 more problems".replace(
        "100000", str(200_000 - MAX_PROBLEMS)
    )
