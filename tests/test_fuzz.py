"""Fuzzing the library's front doors: every public constructor and loader given values of any type, and generated
rule files (random conditions over real facts, random values, adjust chains) loaded and resolved. Only the project's
own errors may come out, each within hypothesis's deadline."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attngate import ModelFacts, Plan, Platform, ServerArgs, resolve
from attngate.errors import AttngateError
from attngate.facts.catalogue import FACTS
from attngate.rules.load import parse_rules
from tests.support.helpers import model


class _Raising:
    """An object whose every attribute read raises (a broken SGLang ServerArgs)."""

    def __getattr__(self, name):
        raise RuntimeError(f"no {name}")


ANY = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), st.binary(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
) | st.just(_Raising())

CONSTRUCTORS = {
    "ServerArgs.from_flags": ServerArgs.from_flags,
    "ServerArgs.from_mapping": ServerArgs.from_mapping,
    "ServerArgs.from_object": ServerArgs.from_object,
    "ModelFacts.from_hf_dict": ModelFacts.from_hf_dict,
    "ModelFacts.from_hf_config": ModelFacts.from_hf_config,
    "Platform.from_name": Platform.from_name,
    "Plan.from_json": Plan.from_json,
    "parse_rules": lambda value: parse_rules(value, "fuzz.yaml"),
    "resolve": lambda value: resolve(value, model("Llama-3.1-8B"), Platform.from_name("sm90")),
}


@pytest.mark.parametrize("name", CONSTRUCTORS)
@settings(max_examples=40, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(value=ANY)
def test_constructors_take_any_value_or_raise_the_projects_error(name, value):
    try:
        CONSTRUCTORS[name](value)
    except AttngateError:
        pass


def _atom(name: str):
    """A well-typed atom over fact ``name``: the type checker accepts it, so the rules reach resolve()."""
    t = FACTS[name].type
    guard = f"{name} is not None and " if t.optional else ""
    if t.base == "bool":
        return st.just(f"({guard}{name})")
    if t.base in ("int", "float"):
        return st.integers(0, 300).map(lambda v: f"({guard}{name} >= {v})")
    if t.choices:
        return st.sampled_from(list(t.choices)).map(lambda v: f"({guard}{name} == {v!r})")
    return st.just(f"({name} is None)") if t.optional else st.just(f"({name} == 'x')")


_NAMES = sorted(n for n, f in FACTS.items() if f.origin in ("server_args", "model", "platform"))
_CONDITIONS = st.recursive(
    st.sampled_from(_NAMES).flatmap(_atom),
    lambda inner: st.one_of(
        st.builds(lambda a, b: f"({a} and {b})", inner, inner),
        st.builds(lambda a, b: f"({a} or {b})", inner, inner),
        st.builds(lambda a: f"not {a}", inner),
    ),
    max_leaves=4,
)
_TARGETS = {  # adjustable arguments and values of their types (out-of-range ones included: a clean refusal)
    "page_size": st.integers(1, 256),
    "attention_backend": st.sampled_from(["fa3", "fa4", "flashinfer", "triton", "torch_native"]),
    "enable_torch_compile": st.booleans(),
    "disable_radix_cache": st.booleans(),
    "chunked_prefill_size": st.integers(-1, 8192),
}
_ENTRY = st.sampled_from(sorted(_TARGETS)).flatmap(
    lambda target: st.tuples(
        st.sampled_from(["set", "adjust", "adjust", "forbid"]),
        _CONDITIONS,
        st.just(target),
        _TARGETS[target],
    )
)


def _rule(i: int, kind: str, when: str, target: str, value) -> str:
    head = f"  - id: fuzz.r{i}\n    kind: {kind}\n    summary: s\n    when: {when!r}\n    why: w\n    source: s\n"
    if kind == "set":
        return head + f"    set: {{fa.num_splits: {abs(hash(when)) % 4}}}\n"
    if kind == "adjust":
        return (
            head
            + f"    adjust: {{{target}: {'null' if value is None else str(value).lower() if isinstance(value, bool) else value}}}\n    message: m\n"
        )
    return head + "    message: m\n"


@settings(max_examples=60, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_ENTRY, min_size=1, max_size=6),
    st.sampled_from(["Llama-3.1-8B", "DeepSeek-V2-Lite", "gemma-3-27b-it"]),
    st.sampled_from(["sm80", "sm90", "sm100"]),
)
def test_generated_rule_files_load_and_resolve_or_raise_the_projects_error(rules, name, gpu):
    text = "version: 1\nrules:\n" + "".join(_rule(i, *entry) for i, entry in enumerate(rules))
    try:
        rule_set = parse_rules(text, "fuzz.yaml")
    except AttngateError:
        return
    try:
        resolve(ServerArgs(), model(name), Platform.from_name(gpu), rule_set)
    except AttngateError:
        pass
