"""The rule language: every kind of error with its location; fuzzing; order independence; conflicts."""

from __future__ import annotations

import random
import textwrap

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attngate import PlanError, Platform, RulesError, ServerArgs, resolve
from attngate.analysis.lint import lint_rules
from attngate.rules.load import parse_rules
from attngate.rules.ruleset import RuleSet
from tests.support.helpers import ROOT, model, resolve_flags

HEAD = "version: 1\nrules:\n"


def rule(**fields) -> str:
    base = {"id": "r", "summary": "s", "why": "w", "source": "s", "when": "True"}
    base.update(fields)
    return "  - " + yaml.safe_dump(base, sort_keys=False, width=1000).replace("\n", "\n    ").rstrip() + "\n"


def problems(text: str) -> list[str]:
    with pytest.raises(RulesError) as err:
        parse_rules(text, "rules.yaml")
    return [str(p) for p in err.value.problems]


@pytest.mark.parametrize(
    "when, expected",
    [
        (
            "is_embeding",
            "rules.yaml:7:11: rule 'r': unknown fact 'is_embeding'\n    help: did you mean 'is_embedding'?",
        ),
        ("page_size == 'x'", "rules.yaml:7:24: rule 'r': page_size is int in [1, 65536] or None, compared with 'x'"),
        (
            "attention_backend == 'fa33'",
            ("rules.yaml:7:32: rule 'r': 'fa33' is not a value of attention_backend (", "help: did you mean 'fa3'?"),
        ),
        (
            "page_size",
            "rules.yaml:7:11: rule 'r': page_size is int in [1, 65536] or None, not a bool; compare it explicitly",
        ),
        ("__import__('os').system('x')", "rules.yaml:7:11: rule 'r': a call is not allowed in a condition"),
        ("page_size + 1 > 2", "rules.yaml:7:11: rule 'r': arithmetic is not allowed in a comparison"),
        ("is_embedding and (", "syntax error"),
        ("forward_mode == 'decode'", "readable only by rules that set per-mode gates"),
        ("fa.skip_kv_cache", "readable only by per-mode and per-layer rules"),
        ("page_size is 3", "'is' is only for None"),
        ("use_mla is None", "use_mla is never None"),
        ("kv_cache_dtype < 'x'", "needs a number"),
        (
            "dp_size == 0",
            "rules.yaml:7:22: rule 'r': dp_size is int in [1, 65536], compared with 0",
        ),  # ServerArgs' bounds
    ],
)
def test_condition_errors_have_locations(when, expected):
    found = problems(HEAD + rule(when=when, set={"fa.skip_kv_cache": True}))
    parts = expected if isinstance(expected, tuple) else (expected,)  # a tuple: every part in one message
    assert any(all(part in p for part in parts) for p in found), found


@pytest.mark.parametrize(
    "gate, value, expected",
    [
        ("common.page_size", 0, "common.page_size is int in [1, 65536], got 0"),
        ("fa.num_splits", -5, "fa.num_splits is int in [0, 256], got -5"),
        (
            "flashinfer.prefill_fixed_split_size",
            0,
            "flashinfer.prefill_fixed_split_size is int in [1, 1099511627776] or None",
        ),
    ],
)
def test_a_rule_setting_a_gate_outside_its_domain_does_not_load(gate, value, expected):
    found = problems(HEAD + rule(when="True", set={gate: value}))
    assert any(p.startswith("rules.yaml:") and expected in p for p in found), found


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "version: true\nrules: []\n",
            "rules.yaml:1:10: version: version is the integer 1, not bool True",
        ),
        ("version: 1.0\nrules: []\n", "rules.yaml:1:10: version: version is the integer 1, not float 1.0"),
        (HEAD + rule(when="True", backends=[], set={"fa.num_splits": 1}), "backends: List should have at least 1 item"),
        (  # fullwidth letters: Python would read the fact use_mla under this name
            "version: 1\npredicates:\n  \uff55\uff53\uff45_\uff4d\uff4c\uff41: 'True'\nrules: []\n",
            "must be a lower-case ASCII identifier",
        ),
        ("version: 1\npredicates:\n  lambda: 'True'\nrules: []\n", "predicate name 'lambda' must be"),
    ],
)
def test_the_rule_language_closes_its_loopholes(text, expected):
    found = problems(text)
    assert any(expected in p for p in found), found


def test_every_error_of_a_file_in_one_run():
    text = (
        HEAD
        + rule(id="a", when="is_embeding", set={"fa.skip_kv_cache": 3, "fa.bogus": True})
        + rule(id="a", kind="adjust", when="True", adjust={"attention_backend": "trion"}, message="m")
        + rule(id="c", kind="forbid", when="True")
        + "  - {id: d, summary: s, why: w, source: s, when: 'True', set: {fa.num_splits: 1}, colour: red}\n"
    )
    found = "\n".join(problems(text))
    for expected in [
        "unknown fact 'is_embeding'",
        "fa.skip_kv_cache is bool, got 3",
        "unknown gate 'fa.bogus'",
        "duplicate rule id 'a'",
        "did you mean 'triton'",
        "kind forbid needs 'message'",
        "unknown key 'colour'",
    ]:
        assert expected in found, expected
    assert found.count("rules.yaml:") >= 7


def test_every_error_of_the_predicates_and_invariants_in_one_run():
    text = textwrap.dedent("""\
        version: 1
        predicates:
          1bad: use_mla
          use_mla: is_embedding
          unfinished: is_embedding and
        invariants:
          - {id: inv.a, summary: s, assert: use_mla or not use_mla, source: x}
          - {id: inv.a, summary: s, assert: use_mla or not use_mla, source: x}
          - {id: inv.b, summary: 5}
          - {id: inv.c, summary: s, assert: use_mla and, source: x}
        rules:
        """) + rule(id="r", kind="forbid", when="use_mla", message="m", set={"fa.num_splits": 1})
    assert problems(text) == [
        "rules.yaml:3:9: predicate name '1bad' must be a lower-case ASCII identifier (a-z, 0-9, _) and no keyword",
        "rules.yaml:4:12: predicate 'use_mla' shadows a fact or an earlier predicate",
        "rules.yaml:5:15: predicate 'unfinished': syntax error: invalid syntax",
        "rules.yaml:20:7: rule 'r': 'set' does not belong to kind forbid",
        "rules.yaml:8:10: duplicate invariant id 'inv.a' (first at rules.yaml:7:10)",
        "rules.yaml:9:26: summary: Input should be a valid string",
        "rules.yaml:9:5: assert: Field required",
        "rules.yaml:9:5: source: Field required",
        "rules.yaml:10:37: invariant 'inv.c': syntax error: invalid syntax",
    ]


def test_an_unknown_key_is_matched_against_the_keys_of_its_own_section():
    """A misspelt invariant key is matched against an invariant's keys, a top-level key against the file's."""
    text = textwrap.dedent("""\
        version: 1
        rulez: []
        invariants:
          - {id: inv.a, summary: s, asert: use_mla or not use_mla, source: x, why: w}
        rules: []
        """)
    found = problems(text)
    assert "rules.yaml:2:8: unknown key 'rulez'\n    help: did you mean 'rules'?" in found
    assert "rules.yaml:4:36: unknown key 'asert'\n    help: did you mean 'assert'?" in found
    assert "rules.yaml:4:76: unknown key 'why'" in found  # an invariant has no why: its summary and source say it


def test_yaml_errors_duplicate_keys_and_tags():
    assert any("duplicate key 'when'" in p for p in problems(HEAD + "  - {id: r, when: 'True', when: 'False'}\n"))
    assert any("YAML syntax error" in p for p in problems("version: 1\nrules: [\n"))
    assert any("unsupported YAML tag" in p for p in problems("!!python/object:os.system {}\n"))
    assert any("rules.yaml:1:1" in p for p in problems("- just a list\n"))


def test_scope_and_kind_errors():
    found = "\n".join(
        problems(
            HEAD
            + rule(when="True", set={"fa.skip_kv_cache": True, "fa.kv_extent": "none"})
            + rule(id="b", kind="adjust", when="True", adjust={"prefill_backend": "fa3"}, message="m")
        )
    )
    assert "different scopes" in found and "unknown server argument 'prefill_backend'" in found


class _Boom(Exception):
    pass


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.text(max_size=200))
def test_random_text_never_escapes(text):
    try:
        parse_rules(text, "fuzz.yaml")
    except RulesError:
        pass


_yaml_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=30)
    | st.sampled_from(
        [
            "__import__('os').system('touch /tmp/attngate-pwned')",
            "is_embedding and not use_mla",
            "fa.skip_kv_cache",
            "(lambda: 1)()",
            "page_size > 1",
        ]
    ),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["id", "kind", "when", "set", "adjust", "summary", "why", "source", "message", "x"])
            | st.text(max_size=8),
            children,
            max_size=6,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_yaml_values, max_size=4), st.booleans())
def test_random_yaml_never_escapes_nor_executes(rules, with_version):
    doc = {"version": 1, "rules": rules} if with_version else {"rules": rules}
    try:
        parse_rules(yaml.safe_dump(doc), "fuzz.yaml")
    except RulesError:
        pass
    import os

    assert not os.path.exists("/tmp/attngate-pwned")


def test_shuffling_rules_never_changes_the_plan(rules):
    text = (ROOT / "rules.yaml").read_text()
    data = yaml.safe_load(text)
    configs = [
        (
            "--attention-backend fa3 --is-embedding --chunked-prefill-size -1 --disable-radix-cache",
            "Qwen3-Embedding-8B",
            "sm90",
        ),
        ("--enable-deterministic-inference", "gemma-2-9b", "sm100"),
        ("--speculative-algorithm NEXTN", "DeepSeek-V3", "sm90"),
        ("", "gpt-oss-20b", "sm90"),
        ("--enable-hierarchical-cache --attention-backend fa3", "Llama-3.1-8B", "sm90"),
    ]
    baseline = [
        resolve(ServerArgs.from_flags(f.split()), model(m), Platform.from_name(g), rules) for f, m, g in configs
    ]
    rng = random.Random(0)
    for _ in range(5):
        rng.shuffle(data["rules"])
        shuffled = parse_rules(yaml.safe_dump(data, sort_keys=False), "shuffled.yaml")
        for (f, m, g), base in zip(configs, baseline):
            again = resolve(ServerArgs.from_flags(f.split()), model(m), Platform.from_name(g), shuffled)
            assert again.plan == base.plan and again.server_args == base.server_args


def _mini(extra: str) -> RuleSet:
    return parse_rules(HEAD + textwrap.dedent(extra), "mini.yaml")


def test_conflicting_set_rules_are_an_error():
    rs = _mini("""\
      - {id: a, summary: s, why: w, source: s, when: "True", set: {fa.num_splits: 1}}
      - {id: b, summary: s, why: w, source: s, when: "use_mla", set: {fa.num_splits: 2}}
      - {id: fill, kind: adjust, summary: s, why: w, source: s, when: attention_backend is None, adjust: {attention_backend: fa3, page_size: 1}, message: m}
    """)
    ok = resolve(ServerArgs(), model("Llama-3.1-8B"), Platform.from_name("sm90"), rs)
    assert ok.plan.fa.num_splits == 1
    with pytest.raises(PlanError) as err:
        resolve(ServerArgs(), model("DeepSeek-V2-Lite"), Platform.from_name("sm90"), rs)
    assert err.value.violations[0].kind == "conflict" and "a sets 1, b sets 2" in err.value.violations[0].message

    assert any("'a' and 'b' can both match" in str(f) for f in lint_rules(rs))


def test_oscillating_adjust_rules_are_named():
    rs = _mini("""\
      - {id: to-fa3, kind: adjust, summary: s, why: w, source: s, when: attention_backend == "triton", adjust: {attention_backend: fa3}, message: m}
      - {id: to-triton, kind: adjust, summary: s, why: w, source: s, when: attention_backend == "fa3", adjust: {attention_backend: triton}, message: m}
    """)
    with pytest.raises(PlanError) as err:
        resolve(ServerArgs(attention_backend="fa3"), model("Llama-3.1-8B"), Platform.from_name("sm90"), rs)
    v = err.value.violations[0]
    assert v.kind == "oscillation" and v.source == "rules" and v.rules == ("to-fa3", "to-triton") and v.rule is None


def test_adjust_rules_disagreeing_in_one_round_are_a_conflict():
    rs = _mini("""\
      - {id: x, kind: adjust, summary: s, why: w, source: s, when: page_size is None, adjust: {page_size: 16}, message: m}
      - {id: y, kind: adjust, summary: s, why: w, source: s, when: page_size is None, adjust: {page_size: 64}, message: m}
    """)
    with pytest.raises(PlanError, match="adjust rules disagree on page_size"):
        resolve(ServerArgs(attention_backend="fa3"), model("Llama-3.1-8B"), Platform.from_name("sm90"), rs)


def test_all_forbid_violations_are_collected():
    with pytest.raises(PlanError) as err:
        resolve_flags(
            "--attention-backend flashinfer --enable-deterministic-inference --kv-cache-dtype mxfp8",
            "gpt-oss-20b",
            "sm90",
        )
    rules = {v.rule for v in err.value.violations}
    assert {"flashinfer.no-attention-sinks", "kv-dtype.mxfp8-blackwell", "gpt-oss.backends"} <= rules


def test_unguarded_order_comparison_is_rejected_before_anything_runs():
    """A rule that loads never makes resolve() raise a TypeError: an order comparison on an optional
    fact needs its None guard (Python's short-circuit: ``x is not None and``, ``x is None or``)."""
    found = problems(HEAD + rule(when="page_size > 1", set={"fa.skip_kv_cache": True}))
    assert any(
        "rules.yaml:7:11: rule 'r': page_size may be None, and > on None raises; guard it" in p for p in found
    ), found
    found = problems(HEAD + rule(when="page_size is not None or page_size > 1", set={"fa.skip_kv_cache": True}))
    assert any("page_size may be None" in p for p in found), found
    for guarded in (
        "page_size is not None and page_size > 1",
        "page_size is None or page_size > 1",
        "not (page_size is None or page_size <= 1)",
        "is_embedding and page_size is not None and page_size >= 2",
    ):
        parse_rules(HEAD + rule(when=guarded, set={"fa.skip_kv_cache": True}), "rules.yaml")


@pytest.mark.parametrize("scope", ["global", "mode"])
def test_a_guarded_comparison_is_explained_without_raising(scope):
    """explain lists a candidate's false conjuncts one by one; ``x > 1`` after ``x is not None and`` is evaluated behind
    its guard there too (on its own it raised a TypeError from resolve() for x None, in a per-mode rule)."""
    when = "is_embedding and speculative_eagle_topk is not None and speculative_eagle_topk > 1"
    if scope == "mode":
        when = 'forward_mode == "target_verify" and ' + when
    gate = "fa.skip_kv_cache" if scope == "global" else "common.tree_mask"
    rules = parse_rules(HEAD + rule(when=when, set={gate: True}), "rules.yaml")
    res = resolve(
        ServerArgs(attention_backend="fa3", page_size=1), model("Llama-3.1-8B"), Platform.from_name("sm90"), rules=rules
    )
    why = res.explanation
    explained = why.gates[gate] if scope == "global" else why.modes["target_verify"][gate]
    assert explained.candidates[0].failed == [
        "is_embedding",
        "speculative_eagle_topk is not None",
        "speculative_eagle_topk > 1",
    ]


def test_lint_reasons_about_two_facts_compared_with_each_other():
    """``fact == fact`` / ``!=`` / ``<`` are encoded for the solver (comparing two facts once crashed lint): rules
    that cannot match together are no conflict, rules that can are."""

    rs = _mini("""\
      - {id: same, summary: s, why: w, source: s, when: prefill_backend == decode_backend, set: {fa.num_splits: 1}}
      - {id: split, summary: s, why: w, source: s, when: prefill_backend != decode_backend, set: {fa.num_splits: 2}}
      - {id: more-tp, summary: s, why: w, source: s, when: tp_size > dp_size, set: {fa.num_splits: 3}}
    """)
    found = [str(f) for f in lint_rules(rs)]
    assert len(found) == 1, found  # one finding per gate, listing every pair
    assert "2 pairs of set rules can both match and disagree on gate fa.num_splits" in found[0]
    assert "same / more-tp" in found[0] and "split / more-tp" in found[0] and "same / split" not in found[0]


def test_lint_reports_every_conflict_of_one_gate_in_one_finding():
    """Forty rules that all match together: 780 conflicting pairs, each named, one witness, one finding."""
    rules = "".join(
        f"  - {{id: r{i}, summary: s, why: w, source: s, when: tp_size >= 2, set: {{fa.num_splits: {i}}}}}\n"
        for i in range(40)
    )
    found = [str(f) for f in lint_rules(_mini(rules))]
    assert len(found) == 1 and found[0].split(": ", 1)[1].startswith("780 pairs of set rules"), found
    assert all(f"r{i} / r{j}" in found[0] for i in range(40) for j in range(i + 1, 40))


@pytest.mark.parametrize(
    "value, expected",
    [
        ("{from: nope}", "speculative_num_draft_tokens: unknown fact 'nope'"),
        ("{from: use_mla}", "speculative_num_draft_tokens is int in [1, 65536] or None; fact use_mla is bool"),
        ("{from: speculative_chain_draft_tokens, and: 1}", "a computed value is written {from: FACT}"),
    ],
)
def test_an_adjust_value_from_a_fact_is_type_checked(value, expected):
    found = problems(
        HEAD
        + "  - {id: r, kind: adjust, summary: s, why: w, source: s, message: m, when: speculative_num_steps is not None, "
        f"adjust: {{speculative_num_draft_tokens: {value}}}}}\n"
    )
    assert any(expected in p for p in found), found


def test_an_adjust_value_from_a_fact_is_resolved_linted_and_diffed():
    """``{from: FACT}`` takes the fact's value when the rule fires; lint proves the rules settle, and diff compares
    the computed value with a literal one."""
    from attngate.analysis.diff import diff_rules

    computed = _mini("""\
      - {id: chain, kind: adjust, summary: s, why: w, source: s, message: m, when: speculative_num_steps is not None and speculative_num_draft_tokens != speculative_chain_draft_tokens, adjust: {speculative_num_draft_tokens: {from: speculative_chain_draft_tokens}}}
      - {id: fill, kind: adjust, summary: s, why: w, source: s, when: attention_backend is None, adjust: {attention_backend: fa3, page_size: 1}, message: m}
    """)
    literal = _mini("""\
      - {id: chain, kind: adjust, summary: s, why: w, source: s, message: m, when: speculative_num_steps is not None and speculative_num_draft_tokens != 4, adjust: {speculative_num_draft_tokens: 4}}
      - {id: fill, kind: adjust, summary: s, why: w, source: s, when: attention_backend is None, adjust: {attention_backend: fa3, page_size: 1}, message: m}
    """)
    r = resolve(
        ServerArgs(speculative_algorithm="EAGLE", speculative_num_steps=6, speculative_eagle_topk=1),
        model("Llama-3.1-8B"),
        Platform.from_name("sm90"),
        computed,
    )
    assert r.server_args.speculative_num_draft_tokens == 7
    assert lint_rules(computed) == []
    differences = [d for d in diff_rules(literal, computed) if d.name == "speculative_num_draft_tokens"]
    assert differences and differences[0].old != differences[0].new, differences
    assert not [d for d in diff_rules(computed, computed)]


def test_numbers_outside_a_facts_bounds_are_refused_where_they_could_never_hold():
    """ServerArgs' ge/le bounds (and counts >= 1) are part of a fact's type: an adjust value or an equality outside
    them is an error at load; an order comparison outside them is only always true or false, so it stays legal."""
    assert problems(HEAD + rule(kind="adjust", adjust={"page_size": 0}, message="m")) == [
        "rules.yaml:10:18: page_size is int in [1, 65536] or None, got 0"
    ]
    parse_rules(HEAD + rule(kind="forbid", when="dp_size >= 0", message="m"), "rules.yaml")


def test_lint_proves_over_the_inputs_the_schema_allows_only():
    """Without the bounds z3 would find dp_size = 0 or num_attention_heads = 0, which no ServerArgs or config holds."""
    text = (
        HEAD
        + rule(kind="forbid", when="False", message="m")
        + (
            "invariants:\n  - id: counts-are-positive\n    summary: s\n"
            "    assert: dp_size >= 1 and attn_cp_size >= 1 and num_attention_heads >= 1 and attn_tp_size >= 1\n    source: s\n"
        )
    )
    assert not [f for f in lint_rules(parse_rules(text, "rules.yaml")) if "invariant" in f.message]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tp=st.sampled_from([1, 2, 3, 4, 8, 16]),
    dp=st.sampled_from([1, 2, 4, 8]),
    cp=st.sampled_from([1, 2, 4]),
    dp_attention=st.booleans(),
    steps=st.none() | st.integers(0, 8),
    topk=st.none() | st.integers(0, 8),
    draft=st.none() | st.integers(1, 32),
    backends=st.tuples(*[st.none() | st.sampled_from(["fa3", "flashinfer", "triton"])] * 3),
    page=st.sampled_from([None, 1, 16, 64]),
    name=st.sampled_from(
        ["Llama-3.1-8B", "DeepSeek-V2-Lite", "gpt-oss-20b", "Qwen3-30B-A3B", "whisper-large-v3-turbo"]
    ),
)
def test_the_provers_derived_fact_definitions_agree_with_derived_facts(
    tp, dp, cp, dp_attention, steps, topk, draft, backends, page, name
):
    """Each derived fact is declared once (attngate.facts.derived) and read two ways: on values by resolve(), on z3
    terms by lint, the invariant proofs and diff (Encoder.axioms and Encoder.links). Every fact value base_facts()
    computes for a real configuration satisfies the z3 reading."""
    import z3

    from attngate.analysis.encoding import Encoder
    from attngate.facts.catalogue import base_facts
    from attngate.rules.load import load_rules

    args = ServerArgs(
        tp_size=tp,
        dp_size=dp,
        attn_cp_size=cp,
        enable_dp_attention=dp_attention,
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=draft,
        attention_backend=backends[0],
        prefill_attention_backend=backends[1],
        decode_attention_backend=backends[2],
        page_size=page,
    )
    facts = base_facts(args, model(name), Platform.from_name("sm90"))
    enc = Encoder(load_rules())
    solver = z3.Solver()
    solver.add(*enc.axioms, *enc.links)
    for fact, value in facts.items():
        if fact in enc.types and enc.types[fact].base != "float":
            solver.add(enc.equals(fact, value))
    assert solver.check() == z3.sat, facts


@pytest.mark.parametrize("when", [1, 0.5])
def test_a_condition_that_is_a_bare_number_is_an_error(when):
    found = problems(HEAD + rule(when=when, set={"fa.skip_kv_cache": True}))
    assert any("when: Input should be a valid boolean" in p for p in found), found


def test_threads_loading_the_rules_at_a_cold_start_parse_them_once(monkeypatch, tmp_path):
    import threading

    from attngate.rules import load

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty disk cache (attngate.rules.cache): cold indeed
    parsed = []
    real = load.parse_rules
    monkeypatch.setattr(load, "parse_rules", lambda *a: parsed.append(a) or real(*a))
    load._load_cached.cache_clear()
    threads = [threading.Thread(target=load.load_rules) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    load._load_cached.cache_clear()  # the other tests' rules come from the real parse_rules again
    assert len(parsed) == 1


def test_lint_finds_adjust_rules_that_undo_each_other_and_resolve_stops_them():
    """A turns torch.compile off where B turned it on, and B the reverse: lint names the pair statically (over
    two states of the inputs), resolve() stops with an oscillation naming both; rules that settle are no finding."""
    cycle = """\
      - {id: turn-off, kind: adjust, summary: s, why: w, source: s, message: m, when: page_size == 16 and enable_torch_compile, adjust: {enable_torch_compile: false}}
      - {id: turn-on, kind: adjust, summary: s, why: w, source: s, message: m, when: page_size == 16 and not enable_torch_compile, adjust: {enable_torch_compile: true}}
      - {id: fill, kind: adjust, summary: s, why: w, source: s, message: m, when: attention_backend is None, adjust: {attention_backend: fa3}}
    """
    rs = _mini(cycle)
    found = [str(f) for f in lint_rules(rs)]
    assert len(found) == 1 and "'turn-off' and 'turn-on' undo each other" in found[0], found
    with pytest.raises(PlanError) as err:
        resolve(ServerArgs(page_size=16), model("Llama-3.1-8B"), Platform.from_name("sm90"), rs)
    assert {v.kind for v in err.value.violations} == {"oscillation"}
    assert set(err.value.violations[0].rules) == {"turn-off", "turn-on"}
    settles = cycle.replace(
        "page_size == 16 and not enable_torch_compile", "page_size == 32 and not enable_torch_compile"
    )
    assert not [str(f) for f in lint_rules(_mini(settles))]
