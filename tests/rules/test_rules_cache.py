"""The disk cache of loaded rule sets (attngate.rules.cache): keyed on the content, never stale, a damaged entry
ignored and parsed again, and a cached rule set resolving and explaining exactly as a parsed one."""

from __future__ import annotations

import ast
import io
import json
import os
import pickle
from pathlib import Path

import pytest

from attngate import Platform, RulesError, ServerArgs, resolve
from attngate.rules import cache
from attngate.rules.load import parse_rules
from attngate.rules.ruleset import RuleSet
from tests.support.helpers import ROOT, model

SHIPPED = (ROOT / "rules.yaml").read_text()


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ATTNGATE_NO_CACHE", raising=False)
    return tmp_path / "attngate"


class Counting:
    """parse_rules, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str, filename: str) -> RuleSet:
        self.calls += 1
        return parse_rules(text, filename)


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("rules-*.pickle"))


def test_a_second_load_of_the_same_text_and_name_reads_the_entry(folder):
    parse = Counting()
    first = cache.load_or_parse(SHIPPED, "rules.yaml", parse)
    assert parse.calls == 1 and len(entries(folder)) == 1
    second = cache.load_or_parse(SHIPPED, "rules.yaml", parse)
    assert parse.calls == 1 and second is not first
    assert [r.id for r in second.rules] == [r.id for r in first.rules]
    assert [r.where for r in second.rules] == [r.where for r in first.rules]
    assert [d.id for d in second.deviations] == [d.id for d in first.deviations]
    assert [i.id for i in second.invariants] == [i.id for i in first.invariants]


def test_other_content_or_another_name_is_another_entry(folder):
    parse = Counting()
    shipped = cache.load_or_parse(SHIPPED, "rules.yaml", parse)
    changed_text = SHIPPED.replace("summary: Prefill and decode backends", "summary: Changed, prefill and", 1)
    assert changed_text != SHIPPED
    changed = cache.load_or_parse(changed_text, "rules.yaml", parse)
    renamed = cache.load_or_parse(SHIPPED, "other.yaml", parse)
    assert parse.calls == 3 and len(entries(folder)) == 3
    assert changed.rules[0].summary.startswith("Changed,") and not shipped.rules[0].summary.startswith("Changed,")
    assert renamed.filename == "other.yaml" and renamed.rules[0].where.startswith("other.yaml:")
    again = cache.load_or_parse(changed_text, "rules.yaml", parse)
    assert parse.calls == 3 and again.rules[0].summary.startswith("Changed,")


def test_the_key_covers_attngates_own_source_and_the_interpreter(monkeypatch):
    key = cache.entry_key(SHIPPED, "rules.yaml")
    assert cache.entry_key(SHIPPED, "rules.yaml") == key
    monkeypatch.setattr(cache, "_digest", b"another attngate")
    assert cache.entry_key(SHIPPED, "rules.yaml") != key
    monkeypatch.setattr(cache, "_digest", None)
    monkeypatch.setattr(cache.sys, "version", "3.99.0 (another interpreter)")
    assert cache.entry_key(SHIPPED, "rules.yaml") != key


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated
        lambda data: data[:-100] + bytes(100),  # payload changed: its checksum no longer matches
        lambda data: b"",
        lambda data: b"not a cache entry at all",
        lambda data: data.replace(cache.FORMAT, b"attngate-rules-cache 0\n"),
    ],
)
def test_a_damaged_entry_is_ignored_parsed_again_and_rewritten(folder, damage):
    parse = Counting()
    cache.load_or_parse(SHIPPED, "rules.yaml", parse)
    (path,) = entries(folder)
    path.write_bytes(damage(path.read_bytes()))
    rule_set = cache.load_or_parse(SHIPPED, "rules.yaml", parse)
    assert parse.calls == 2 and len(rule_set.rules) > 100
    cache.load_or_parse(SHIPPED, "rules.yaml", parse)
    assert parse.calls == 2  # the rewritten entry is read


def _entry(folder: Path, pickled: bytes, codes: tuple = ()) -> None:
    """Replace the one entry by a well-formed one holding ``pickled`` (and ``codes``)."""
    import hashlib
    import marshal

    (path,) = entries(folder)
    payload = marshal.dumps((codes, pickled))
    path.write_bytes(cache.FORMAT + hashlib.sha256(payload).digest() + payload)


def test_an_entry_holding_anything_but_a_rule_set_is_never_unpickled_into_use(folder):
    parse = Counting()
    cache.load_or_parse(SHIPPED, "rules.yaml", parse)

    class Runs:
        def __reduce__(self):
            return (os.system, ("echo unpickled > /dev/null",))

    _entry(folder, pickle.dumps(Runs()))  # a well-formed entry naming a function no rule set holds
    assert len(cache.load_or_parse(SHIPPED, "rules.yaml", parse).rules) > 100 and parse.calls == 2
    _entry(folder, pickle.dumps({"rules": []}))
    assert len(cache.load_or_parse(SHIPPED, "rules.yaml", parse).rules) > 100 and parse.calls == 3
    for codes, pid in (((), 5), (("not code",), 0)):  # a code reference to nothing, or to no code
        refs = io.BytesIO()
        pickler = pickle.Pickler(refs)
        pickler.persistent_id = lambda obj, pid=pid: pid if obj == "code" else None
        pickler.dump(["code"])
        _entry(folder, refs.getvalue(), codes)
        assert len(cache.load_or_parse(SHIPPED, "rules.yaml", parse).rules) > 100
    assert parse.calls == 5


@pytest.mark.skipif(os.name != "posix", reason="file modes")
def test_an_entry_others_may_write_is_ignored(folder):
    parse = Counting()
    cache.load_or_parse(SHIPPED, "rules.yaml", parse)
    (path,) = entries(folder)
    path.chmod(0o666)
    cache.load_or_parse(SHIPPED, "rules.yaml", parse)
    assert parse.calls == 2


def test_rules_that_do_not_load_are_never_stored(folder):
    parse = Counting()
    bad = "version: 1\nrules:\n  - {id: r, summary: s, why: w, source: s, when: is_embeding}\n"
    for _ in range(2):
        with pytest.raises(RulesError, match="unknown fact 'is_embeding'"):
            cache.load_or_parse(bad, "rules.yaml", parse)
    assert parse.calls == 2 and not entries(folder)


def test_off_or_unwritable_the_rules_still_load(folder, monkeypatch, tmp_path):
    parse = Counting()
    monkeypatch.setenv("ATTNGATE_NO_CACHE", "1")
    cache.load_or_parse(SHIPPED, "rules.yaml", parse)
    assert parse.calls == 1 and not folder.exists()
    monkeypatch.delenv("ATTNGATE_NO_CACHE")
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # its attngate folder cannot be made
    assert len(cache.load_or_parse(SHIPPED, "rules.yaml", parse).rules) > 100 and parse.calls == 2


def test_entries_beyond_the_limit_are_removed_least_recently_used_first(folder, monkeypatch):
    monkeypatch.setattr(cache, "MAX_ENTRIES", 2)
    texts = [f"version: 1\nrules: []\n# {i}\n" for i in range(3)]
    for age, text in ((300, texts[0]), (200, texts[1])):  # written long ago, the first one first
        cache.load_or_parse(text, "rules.yaml", parse_rules)
        path = folder / f"rules-{cache.entry_key(text, 'rules.yaml')}.pickle"
        os.utime(path, (10**9 - age, 10**9 - age))
    parse = Counting()
    cache.load_or_parse(texts[0], "rules.yaml", parse)  # the oldest entry, used now
    cache.load_or_parse(texts[2], "rules.yaml", parse)  # a third: the least recently used one goes
    assert parse.calls == 1 and len(entries(folder)) == 2
    cache.load_or_parse(texts[0], "rules.yaml", parse)
    assert parse.calls == 1
    cache.load_or_parse(texts[1], "rules.yaml", parse)
    assert parse.calls == 2


@pytest.mark.parametrize(
    "name, gpu, flags",
    [
        ("Llama-3.1-8B", "sm90", {}),
        ("DeepSeek-V3", "sm100", {}),
        ("gemma-3-27b-it", "sm90", {"attention_backend": "flashinfer"}),
        ("Qwen3-Embedding-8B", "sm90", {"attention_backend": "fa3", "is_embedding": True}),
        ("whisper-large-v3-turbo", "sm80", {}),
    ],
)
def test_a_cached_rule_set_resolves_and_explains_as_the_parsed_one(folder, name, gpu, flags):
    parsed = parse_rules(SHIPPED, "rules.yaml")
    cache.load_or_parse(SHIPPED, "rules.yaml", parse_rules)
    cached = cache.load_or_parse(SHIPPED, "rules.yaml", lambda *a: pytest.fail("parsed again"))
    results = []
    for rule_set in (parsed, cached):
        resolution = resolve(ServerArgs(**flags), model(name), Platform.from_name(gpu), rule_set)
        explanation = resolution.explanation
        results.append(
            (
                resolution.plan.fingerprint,
                json.dumps(resolution.plan.model_dump(mode="json"), sort_keys=True),
                repr(explanation),
                [str(a) for a in resolution.adjustments],
                [d.id for d in resolution.deviations],
            )
        )
    assert results[0] == results[1]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_a_fifo_in_place_of_the_entry_is_never_waited_on(folder):
    folder.mkdir(parents=True)
    os.mkfifo(folder / f"rules-{cache.entry_key(SHIPPED, 'rules.yaml')}.pickle")
    parse = Counting()
    assert len(cache.load_or_parse(SHIPPED, "rules.yaml", parse).rules) > 100 and parse.calls == 1


def test_a_cached_condition_parses_its_syntax_trees_again_as_they_were(folder):
    """The entry leaves syntax trees out (lint and conjuncts without code read them): each is parsed again from the
    condition's text, the same tree, the same conjunct operands and guards."""
    parsed = parse_rules(SHIPPED, "rules.yaml")
    cache.load_or_parse(SHIPPED, "rules.yaml", parse_rules)
    cached = cache.load_or_parse(SHIPPED, "rules.yaml", lambda *a: pytest.fail("parsed again"))
    pairs = [(a.condition, b.condition) for a, b in zip(parsed.rules, cached.rules)]
    pairs += [(a.condition, b.condition) for a, b in zip(parsed.predicates, cached.predicates)]
    pairs += [(a.condition, b.condition) for a, b in zip(parsed.invariants, cached.invariants)]
    pairs += [(a.condition, b.condition) for a, b in zip(parsed.deviations, cached.deviations)]
    assert len(pairs) > 250
    for a, b in pairs:
        assert (b.text, b.reads, [c.text for c in b.conjuncts]) == (a.text, a.reads, [c.text for c in a.conjuncts])
        assert b._tree is None and ast.dump(b.tree) == ast.dump(a.tree)
        for x, y in zip(a.conjuncts, b.conjuncts):
            assert ast.dump(y.node) == ast.dump(x.node)
            assert [ast.dump(g) for g in y.guards] == [ast.dump(g) for g in x.guards]
            assert any(y.node is part for part in ast.walk(b.tree))  # an operand of the condition's own tree
