"""Deviation files as an attacker and a careless user write them (issue 53 item 10): generated ``deviations:``
sections (fields empty, repeated, unknown or of the wrong type; ``when`` true, left out, a tautology, a contradiction,
over an unknown fact or no expression at all; refusal deviations naming rules that refuse, that never refuse, or that
do not exist; duplicate keys, anchors, merge keys, huge scalars) load or are refused with the project's own error
naming ``file:line:col``, within a time bound. What loads declares only what it names: lint finds the tautologies and
contradictions among them, and conform's comparison (compare_case, under verify()) never excuses a difference of a
field, or a refusal by a rule, that no holding deviation names."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

from attngate.analysis.lint import lint_rules
from attngate.errors import RulesError
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.integrations.sglang.compare import compare_case
from attngate.integrations.sglang.fields import attngate_values
from attngate.rules.deviations import DEVIATION_FIELDS, REFUSAL, SGLANG_REFUSAL, given_facts
from attngate.rules.load import parse_rules
from tests.support.helpers import model

FILE = "dev.yaml"
RULES = """version: 1
rules:
  - {id: fb, kind: forbid, summary: s, why: w, source: s, when: use_mla and is_embedding, message: m}
  - {id: kf, kind: known_failure, summary: s, why: w, source: s, when: is_embedding and use_mla, message: m, issue: i}
  - {id: kf-fallback, kind: known_failure, summary: s, why: w, source: s, when: is_embedding and not use_mla,
     message: m, issue: i, fallback: {disable_radix_cache: true}}
  - {id: adj, kind: adjust, summary: s, why: w, source: s, when: is_multimodal, adjust: {page_size: 16}, message: m}
  - {id: st, summary: s, why: w, source: s, when: use_mla, set: {fa.num_splits: 1}}
"""
REFUSING = {"fb", "kf"}  # the rules above that refuse a configuration
BUDGET_S = 5.0  # one example: load, lint and compare

# ---- conditions, each with what it is: "taut" (holds for every configuration), "contra" (never holds), "bad"
# (loading refuses it), "other" (may or may not hold: nothing asserted of lint) -----------------------------------

ATOMS = [
    "use_mla",
    "is_embedding",
    "not use_mla",
    "page_size == 16",
    "page_size is not None and page_size > 1",
    "attention_backend == 'fa3'",
    "attention_backend in ('fa3', 'flashinfer')",
    "gpu_arch == 'sm90'",
    "tp_size > 1",
    "(" * 60 + "use_mla" + ")" * 60,  # brackets nest no expression
]
TAUTOLOGIES = [
    "True",
    "use_mla or not use_mla",
    "is_embedding or not is_embedding",
    "page_size is None or page_size >= 1",
    "tp_size >= 1",
    "not (use_mla and not use_mla)",
]
CONTRADICTIONS = [
    "False",
    "use_mla and not use_mla",
    "page_size == 16 and page_size == 32",
    "tp_size < 1",
]
BAD = [
    "",
    "   ",
    "use_mla and",
    "(",
    "use_mla ==",
    "no_such_fact",
    "use_mlaa",
    "fa.num_splits == 1",  # a gate: deviations read the configuration as given, never a gate
    "__import__('os')",
    "lambda: 1",
    "[x for x in ()]",
    "attention_backend == 'fa9'",
    "page_size == 'x'",
    "use_mla\u202e",
    "\x1b]0;pwned\x07",
    "1 +",
    "tp_size == 1 if use_mla else 2",
    "not " * 60 + "use_mla",  # nested deeper than a condition may be
    " or ".join(["use_mla"] * 900),  # longer than a condition may be
]
# bad only where nothing beside it guards it: a conjunct before it may narrow page_size to an int
# ("page_size is not None and page_size > 1", then "(...) and (page_size > 1)" is well typed), so never combined
UNGUARDED = ["page_size > 1"]  # page_size may be None


def _combine(op: str, a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    kinds = {a[1], b[1]}
    if "bad" in kinds:
        kind = "bad"
    elif op == "and":
        kind = "contra" if "contra" in kinds else "taut" if kinds == {"taut"} else "other"
    else:
        kind = "taut" if "taut" in kinds else "contra" if kinds == {"contra"} else "other"
    return f"({a[0]}) {op} ({b[0]})", kind


_FLIP = {"taut": "contra", "contra": "taut", "other": "other", "bad": "bad"}
KIND: dict[str, str] = {}  # every condition generated -> its kind (a function of the text: combinations are bracketed)


def _noted(condition: tuple[str, str]) -> tuple[str, str]:
    KIND[condition[0]] = condition[1]
    return condition


def _conditions(*atoms: st.SearchStrategy[tuple[str, str]]) -> st.SearchStrategy[tuple[str, str]]:
    return st.recursive(
        st.one_of(*atoms),
        lambda inner: st.one_of(
            st.builds(_combine, st.sampled_from(["and", "or"]), inner, inner),
            inner.map(lambda c: (f"not ({c[0]})", _FLIP[c[1]])),
        ),
        max_leaves=3,
    ).map(_noted)


_WELL_TYPED = (
    st.sampled_from(ATOMS).map(lambda t: (t, "other")),
    st.sampled_from(TAUTOLOGIES).map(lambda t: (t, "taut")),
    st.sampled_from(CONTRADICTIONS).map(lambda t: (t, "contra")),
)
WELL_TYPED = _conditions(*_WELL_TYPED)
CONDITIONS = st.one_of(
    _conditions(*_WELL_TYPED, st.sampled_from(BAD).map(lambda t: (t, "bad"))),
    st.sampled_from(UNGUARDED).map(lambda t: _noted((t, "bad"))),
)
# a `when` as written: a condition (as text), a YAML bool, no `when` at all, or a value of the wrong type
MISSING = object()
WHEN = st.one_of(
    CONDITIONS,
    st.sampled_from([True, False]).map(lambda b: (b, "taut" if b else "contra")),
    st.just((MISSING, "taut")),
    st.sampled_from([3, 1.5, None, ["use_mla"], {"use_mla": True}]).map(lambda v: (v, "bad")),
)

VALUE_FIELDS = ["page_size", "attention_backend", "prefill_attention_backend", "decode_attention_backend", "tp_size"]
FIELD_NAMES = st.one_of(
    st.sampled_from([*VALUE_FIELDS, REFUSAL, SGLANG_REFUSAL]),
    st.sampled_from(["page-size", "no_such_field", "", "Refusal", "fa.num_splits", "x" * 500]),
    st.sampled_from([1, None, True, ["page_size"]]),
)
FIELDS = st.one_of(
    st.lists(FIELD_NAMES, max_size=4),  # [] and repeats included
    FIELD_NAMES,  # one field written as a scalar
    st.sampled_from([{"page_size": 1}, 0]),
)
RULE_IDS = st.one_of(st.sampled_from(["fb", "kf", "kf-fallback", "adj", "st", "fbb", "nope"]), st.just(3))
HUGE = "<a scalar of 300,000 characters>"  # written out by render (a short repr for hypothesis's reports)
TAGGED = "<a scalar with a Python tag>"
WRITTEN = {HUGE: json.dumps("x" * 300_000), TAGGED: "!!python/name:os.system ''"}
TEXTS = st.one_of(
    st.sampled_from(["r", "s", "", HUGE, TAGGED, "\x1b[2J", "\u202etxt", 5, 10**100, 1e309, None]),
    st.text(max_size=8),
)


@st.composite
def deviation(draw: Any, index: int) -> list[tuple[str, Any]]:
    """One deviation as (key, value) pairs, as written: keys may repeat, be unknown or be left out."""
    pairs: list[tuple[str, Any]] = [
        ("id", draw(st.one_of(st.just(f"d{index}"), st.sampled_from(["d0", "D-upper", "", 7, "a" * 1000])))),
        ("fields", draw(FIELDS)),
    ]
    when, _ = draw(WHEN)
    if when is not MISSING:
        pairs.append(("when", when))
    if draw(st.booleans()):
        pairs.append(("rules", draw(st.one_of(st.lists(RULE_IDS, max_size=3), st.sampled_from(["fb", {"fb": 1}])))))
    pairs += [("reason", draw(TEXTS)), ("source", draw(TEXTS))]
    for _ in range(draw(st.integers(0, 2))):  # a repeated, unknown or dropped key
        what = draw(st.sampled_from(["repeat", "unknown", "drop"]))
        i = draw(st.integers(0, len(pairs) - 1))
        if what == "repeat":
            pairs.insert(i, (pairs[i][0], draw(TEXTS)))
        elif what == "unknown":
            pairs.insert(i, (draw(st.sampled_from(["field", "rule", "when_", "Reason", "<<x"])), "v"))
        else:
            del pairs[i]
    return pairs


@st.composite
def valid_deviation(draw: Any, index: int) -> list[tuple[str, Any]]:
    """A deviation the schema takes (unique id, known fields, a condition), so that loading reaches the checks of
    what it declares and the rest of the property (lint, compare) runs on many accepted files."""
    fields = draw(
        st.lists(st.sampled_from([*VALUE_FIELDS, REFUSAL, SGLANG_REFUSAL]), min_size=1, max_size=3, unique=True)
    )
    pairs: list[tuple[str, Any]] = [("id", f"d{index}"), ("fields", fields)]
    when, _ = draw(st.one_of(WELL_TYPED, WELL_TYPED, WELL_TYPED, WHEN))
    if when is not MISSING:
        pairs.append(("when", when))
    if REFUSAL in fields:
        pairs.append(
            (
                "rules",
                draw(st.lists(st.sampled_from(["fb", "kf", "fb", "kf", "kf-fallback", "fbb"]), min_size=1, max_size=2)),
            )
        )
    return pairs + [("reason", "r"), ("source", "s")]


def _scalar(value: Any, plain: bool) -> str:
    """``value`` as a YAML flow value: a plain scalar where YAML reads it back as the same string, else JSON."""
    if plain and isinstance(value, str) and re.fullmatch(r"[a-z_][a-z0-9_ =.()']*[a-z0-9_)']", value):
        if yaml.safe_load(value) == value:
            return value
    return WRITTEN[value] if isinstance(value, str) and value in WRITTEN else json.dumps(value)


def render(entries: list[list[tuple[str, Any]]], shape: str, plain: bool) -> str:
    """The file: RULES, then ``deviations:`` in ``shape``: a block list of block mappings (keys as given), one whose
    first entry is anchored and then aliased or merged, a flow list, or a section of the wrong type."""
    if shape == "mapping":
        return RULES + "deviations:\n  d0: {fields: page_size, when: use_mla, reason: r, source: s}\n"
    if shape in ("scalar", "null"):
        return RULES + ("deviations: use_mla\n" if shape == "scalar" else "deviations:\n")
    if shape == "flow":
        items = [", ".join(f"{json.dumps(k)}: {_scalar(v, False)}" for k, v in e) for e in entries]
        return RULES + "deviations: [" + ", ".join("{" + i + "}" for i in items) + "]\n"
    out = [RULES, "deviations:\n"]
    for n, entry in enumerate(entries):
        anchor = " &first" if n == 0 and shape in ("alias", "merge") else ""
        if not entry:
            out.append(f"  -{anchor} {{}}\n")
            continue
        for i, (key, value) in enumerate(entry):
            lead = f"  -{anchor} " if i == 0 else "    "
            out.append(f"{lead}{key}: {_scalar(value, plain)}\n")
    if shape == "alias" and entries:
        out.append("  - *first\n")  # the same deviation again: its id twice
    if shape == "merge" and entries:
        out.append("  - <<: *first\n    id: merged\n")
    return "".join(out)


def _entries(n: int, mutants: bool) -> st.SearchStrategy[list]:
    """``n`` deviations: each one a schema accepts, or (``mutants``) also any written as above."""
    return st.tuples(
        *[st.one_of(deviation(i), valid_deviation(i)) if mutants else valid_deviation(i) for i in range(n)]
    ).map(list)


DOCUMENT = st.tuples(
    st.integers(1, 3).flatmap(lambda n: st.sampled_from([False, False, True]).flatmap(lambda m: _entries(n, m))),
    st.sampled_from(["block"] * 12 + ["flow", "alias", "merge", "mapping", "scalar", "null"]),
    st.booleans(),  # plain scalars where YAML reads them back as written
    st.booleans(),  # CRLF line ends
)

# ---- the comparison conform and verify() make, with SGLang's side standing in ------------------------------------

BASE = ServerArgs().model_dump() | {"attn_dp_size": 1, "cuda_graph_config": None, "page_size": 1}
GIVEN = st.fixed_dictionaries(
    {
        "attention_backend": st.sampled_from(["fa3", "flashinfer", "triton"]),
        "page_size": st.sampled_from([1, 16, 64]),
        "is_embedding": st.booleans(),
        "tp_size": st.sampled_from([1, 2]),
    }
)
# SGLang's resolution: refused, or the configuration with some fields resolved otherwise (often those the file's
# deviations name, so that what they declare is tried)
ALTERNATIVES = {
    "page_size": st.sampled_from([1, 16, 32]),
    "attention_backend": st.sampled_from(["fa3", "triton", "flashinfer"]),
    "prefill_attention_backend": st.sampled_from([None, "fa3", "triton"]),
    "decode_attention_backend": st.sampled_from([None, "flashinfer", "triton"]),
    "tp_size": st.sampled_from([1, 2, 4]),
    "kv_cache_dtype": st.sampled_from(["auto", "fp8_e4m3"]),
    "disable_radix_cache": st.booleans(),
}


def _named(entries: list[list[tuple[str, Any]]]) -> list[str]:
    listed = [v if isinstance(v, list) else [v] for entry in entries for k, v in entry if k == "fields"]
    return sorted({f for names in listed for f in names if isinstance(f, str) and f in ALTERNATIVES})


def compared(named: list[str]) -> st.SearchStrategy[tuple]:
    """One configuration and SGLang's outcome of it: (model, gpu, the arguments given, SGLang's values that differ
    from them, None where SGLang refused)."""
    otherwise = st.fixed_dictionaries({}, optional=ALTERNATIVES)
    if named:
        otherwise |= st.lists(st.sampled_from(named), min_size=1, unique=True).flatmap(
            lambda keys: st.fixed_dictionaries({k: ALTERNATIVES[k] for k in keys})
        )
    return st.tuples(
        st.sampled_from(["Llama-3.1-8B", "DeepSeek-V2-Lite"]),
        st.sampled_from(["sm90", "sm100"]),
        GIVEN,
        st.one_of(st.none(), otherwise, otherwise),
    )


CASES = DOCUMENT.flatmap(
    lambda doc: st.tuples(st.just(doc), st.lists(compared(_named(doc[0])), min_size=1, max_size=3))
)


def _check_comparison(rule_set: Any, compared: tuple) -> None:
    """Every difference compare_case declares is declared by holding deviations that name it (a prefill or decode
    backend through a deviation of attention_backend where that differs too), and an attngate refusal only where the
    declaring deviations name every rule it refused through."""
    name, gpu, given, sglang = compared
    facts_model, platform = model(name), Platform.from_name(gpu)
    given = BASE | given
    resolved = None if sglang is None else given | sglang
    result = compare_case(
        "case", given, resolved, "refused" if sglang is None else None, facts_model, platform, rule_set
    )
    args = ServerArgs.from_mapping(attngate_values(given), source="sglang")
    facts = given_facts(rule_set, args, facts_model, platform)
    by_id = {d.id: d for d in rule_set.deviations}
    for key, ids in result.declared.items():
        assert key in result.differences, (key, result)
        for deviation in (by_id[i] for i in ids):
            assert deviation.condition(facts), f"{deviation.id} does not hold, yet declared {key}"
            names = key in deviation.fields or (
                key in ("prefill_attention_backend", "decode_attention_backend")
                and "attention_backend" in deviation.fields
                and "attention_backend" in result.differences
            )
            assert names, f"deviation {deviation.id} (fields {deviation.fields}) declared a difference of {key}"
        if key == REFUSAL:
            refused_by = set(result.origins.get(REFUSAL, "").split(", "))
            named = {r for i in ids for r in by_id[i].rules}
            assert refused_by <= named, (refused_by, named)
    event(f"declared {'/'.join(sorted(result.declared)) or 'nothing'} of {len(result.differences)} difference(s)")


# ---- the property --------------------------------------------------------------------------------------------------

_WHERE = re.compile(rf"^{re.escape(FILE)}:(\d+):(\d+)")


def _located(problem: Any, lines: list[str]) -> None:
    found = _WHERE.match(problem.where or "")
    assert found, f"not at file:line:col: {problem}"
    line, col = int(found[1]), int(found[2])
    assert 1 <= line <= len(lines) + 1 and 1 <= col <= len((lines + [""])[line - 1]) + 1, (str(problem), line, col)


def _conditions_written(text: str) -> list[tuple[list, Any]]:
    """(fields, when) of each deviation, as a plain YAML reader sees the accepted file."""
    return [
        (e["fields"] if isinstance(e["fields"], list) else [e["fields"]], e.get("when", MISSING))
        for e in yaml.safe_load(text)["deviations"]
    ]


def _kind(when: Any) -> str:
    if when is MISSING or when is True:
        return "taut"
    if when is False:
        return "contra"
    return KIND.get(when, "other") if isinstance(when, str) else "bad"


@settings(
    max_examples=300,
    deadline=None,
    phases=[p for p in Phase if p is not Phase.explain],  # a failure is shown as found (explaining it takes minutes)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=CASES)
@example(  # a conjunct guarded by the one before it is well typed (the property once counted it bad)
    case=(
        (
            [
                [
                    ("id", "d0"),
                    ("fields", ["page_size"]),
                    ("when", "(page_size is not None and page_size > 1) and (page_size > 1)"),
                    ("reason", "r"),
                    ("source", "s"),
                ]
            ],
            "block",
            False,
            False,
        ),
        [
            (
                "Llama-3.1-8B",
                "sm90",
                {"attention_backend": "fa3", "page_size": 1, "is_embedding": False, "tp_size": 1},
                None,
            )
        ],
    )
)
@example(  # found by this property: a deviations section of the wrong type (null included) was dropped unread
    case=(
        (
            [[("id", "d0"), ("fields", "page_size"), ("when", "use_mla"), ("reason", "r"), ("source", "s")]],
            "null",
            True,
            False,
        ),
        [],
    )
)
@example(  # issue 53: `when: true` declaring every field passed SGLang's triton against the Plan's fa3
    case=(
        (
            [
                [
                    ("id", "d0"),
                    ("fields", ["attention_backend", "page_size", REFUSAL, SGLANG_REFUSAL]),
                    ("when", True),
                    ("rules", ["fb"]),
                    ("reason", "r"),
                    ("source", "s"),
                ]
            ],
            "block",
            True,
            False,
        ),
        [
            (
                "Llama-3.1-8B",
                "sm90",
                {"attention_backend": "fa3", "page_size": 1, "is_embedding": False, "tp_size": 1},
                {"attention_backend": "triton"},
            )
        ],
    ),
)
def test_deviation_files_load_or_are_refused_at_their_place_and_excuse_only_what_they_name(case):
    (entries, shape, plain, crlf), compared = case
    text = render(entries, shape, plain)
    if crlf:
        text = text.replace("\n", "\r\n")
    lines = text.replace("\r\n", "\n").split("\n")
    start = time.monotonic()
    try:
        rule_set = parse_rules(text, FILE)
    except RulesError as err:
        event("refused")
        assert err.problems
        for problem in err.problems:
            _located(problem, lines)
        assert time.monotonic() - start < BUDGET_S
        return
    event(f"accepted {shape}")
    written = _conditions_written(text)
    assert len(rule_set.deviations) == len(written)
    for deviation, (fields, when) in zip(rule_set.deviations, written):
        assert deviation.fields == tuple(fields) and len(set(fields)) == len(fields) > 0
        assert set(fields) <= set(DEVIATION_FIELDS)
        assert bool(deviation.rules) == (REFUSAL in fields) and set(deviation.rules) <= REFUSING
        assert _kind(when) != "bad", (deviation, when)
        if set(fields) - {REFUSAL}:  # a value or sglang_refusal deviation is bounded by a condition written out
            assert when is False or isinstance(when, str), (deviation, when)
    found = lint_rules(rule_set)
    for deviation, (fields, when) in zip(rule_set.deviations, written):
        at = [f.message for f in found if f.where == deviation.where]
        if _kind(when) == "taut" and set(fields) - {REFUSAL}:
            assert any("holds for every configuration" in m for m in at), (deviation, at)
        if _kind(when) == "contra":
            assert any("never" in m for m in at), (deviation, at)
    for one in compared:
        _check_comparison(rule_set, one)
    assert time.monotonic() - start < BUDGET_S


@pytest.mark.parametrize(
    ("section", "place"),
    [
        ("deviations: use_mla", "use_mla"),
        ("deviations:", ""),  # null: where its value would start
        ("deviations: {d0: {fields: page_size, when: use_mla, reason: r, source: s}}", "{"),
        ("invariants: 3", "3"),
    ],
)
def test_a_section_of_the_wrong_type_is_refused_never_dropped(section: str, place: str):
    """Found by the property above: a deviations (or invariants) section that is no list loaded as an empty one."""
    with pytest.raises(RulesError) as err:
        parse_rules(RULES + section + "\n", FILE)
    name = section.split(":")[0]
    col = section.index(place) + 1 if place else len(section) + 1
    assert [str(p) for p in err.value.problems] == [f"{FILE}:9:{col}: {name}: Input should be a valid list"]
