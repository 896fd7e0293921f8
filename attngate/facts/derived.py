"""Facts derived from server arguments and model facts, each declared once: its type, its meaning and its definition.

A definition is written over :class:`Terms`, a small algebra with two readings: on a configuration's values
(:func:`derived_facts`, what ``resolve()`` reads) and on z3 terms (``attngate.analysis.encoding``, what lint, the
invariant proofs and diff reason over). One definition serves both, so the resolver and the prover cannot drift
apart; ``tests/rules/test_rule_language.py`` holds the two readings to the same values.

A definition may read facts declared before it (``attn_tp_size`` reads ``attn_dp_group_size``); the z3 reading
joins the definitions a derived fact depends on (:func:`dependencies`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from attngate.facts.choices import ATTENTION_BACKENDS
from attngate.types import FactType

#: a value, or a thunk giving it (where the value can only be computed on one branch: arithmetic over a fact that
#: may be None)
Lazy = Any


class Terms(Protocol):
    """The operations a definition may use besides ``+``, ``%``, ``==`` and ``>=`` (which Python values and z3 terms
    both have)."""

    def __getitem__(self, name: str) -> Any:
        """The fact's value (read only where it is not None)."""

    def none(self, name: str) -> Any:
        """Whether the fact is None."""

    def if_(self, cond: Any, then: Lazy, other: Lazy) -> Any:
        """``then`` where ``cond`` holds, else ``other``; a branch given as a thunk is evaluated only where taken."""

    def all(self, *conds: Any) -> Any:
        """Every condition holds."""

    def any(self, *conds: Any) -> Any:
        """Some condition holds."""

    def div(self, a: Any, b: Any) -> Any:
        """``a // b`` of non-negative integers, ``b >= 1``."""


@dataclass(frozen=True)
class DerivedFact:
    """One derived fact.

    Parameters
    ----------
    name : str
        The fact rules read.
    type : FactType
        Its type (``optional`` where ``none_when`` may hold).
    doc : str
        What it means, with its SGLang source where it restates SGLang's.
    value : callable
        ``value(t) -> term``: its value where it is not None.
    none_when : callable, optional
        ``none_when(t) -> condition``: where it is None (only for an optional fact).
    axiom : bool
        Whether the prover always joins its definition (cheap: no arithmetic), rather than only once a query found
        a model without it (integer division slows a query down; see ``attngate.analysis.encoding``).
    """

    name: str
    type: FactType
    doc: str
    value: Callable[[Terms], Any]
    none_when: Callable[[Terms], Any] | None = None
    axiom: bool = False


def _at_least_one(t: Terms, x: Any) -> Any:
    return t.if_(x >= 1, x, 1)


def _kv_heads(t: Terms, fact: str) -> Any:
    """KV heads a rank splits: MLA's one latent head, else the config's."""
    return t.if_(t["use_mla"], 1, t[fact])


def _splits(t: Terms, q: Any, kv: Any) -> Any:
    """SGLang's head split: query heads divide by attn_tp_size; KV heads divide by it, or it by them (replicated)."""
    tp = t["attn_tp_size"]
    return t.all(q % tp == 0, t.any(kv % tp == 0, tp % kv == 0))


def _per_rank(name: str, heads: str, doc: str) -> DerivedFact:
    """Heads of one attention TP rank, at least one: ``heads`` (a KV-head fact: MLA's one latent head) split over
    attn_tp_size."""
    read = (lambda t: _kv_heads(t, heads)) if "key_value" in heads else (lambda t: t[heads])
    return DerivedFact(
        name, FactType("int", minimum=1), doc, lambda t: _at_least_one(t, t.div(read(t), t["attn_tp_size"]))
    )


def _phase_backend(phase: str) -> DerivedFact:
    return DerivedFact(
        f"{phase}_backend",
        FactType("str", ATTENTION_BACKENDS, True),
        f"{phase}_attention_backend, else attention_backend",
        lambda t: t.if_(
            t.none(f"{phase}_attention_backend"),
            lambda: t["attention_backend"],
            lambda: t[f"{phase}_attention_backend"],
        ),
        none_when=lambda t: t.all(t.none(f"{phase}_attention_backend"), t.none("attention_backend")),
        axiom=True,
    )


#: Every derived fact, in the order they are computed (a definition reads only facts declared before it).
DERIVED_FACTS: tuple[DerivedFact, ...] = (
    _phase_backend("prefill"),
    _phase_backend("decode"),
    DerivedFact(
        "attn_dp_group_size",
        FactType("int", minimum=0),
        "ranks of one attention DP group: tp_size // dp_size under DP attention, else tp_size",
        lambda t: t.if_(t["enable_dp_attention"], t.div(t["tp_size"], t["dp_size"]), t["tp_size"]),
    ),
    DerivedFact(
        "attn_tp_size",
        FactType("int", minimum=1),
        "ranks one attention layer's heads are split over: tp_size / dp_size under DP attention, else tp_size, "
        "then / attn_cp_size (SGLang's derive_attention_widths)",
        lambda t: _at_least_one(t, t.div(t["attn_dp_group_size"], t["attn_cp_size"])),
    ),
    _per_rank("num_q_heads_per_rank", "num_attention_heads", "query heads of one attention TP rank"),
    _per_rank(
        "num_kv_heads_per_rank",
        "num_key_value_heads",
        "KV heads of one attention TP rank (replicated when attn_tp_size exceeds them; 1 for MLA's latent)",
    ),
    _per_rank(
        "swa_num_q_heads_per_rank",
        "swa_num_attention_heads",
        "query heads of one attention TP rank in a sliding-window layer",
    ),
    _per_rank(
        "swa_num_kv_heads_per_rank",
        "swa_num_key_value_heads",
        "KV heads of one attention TP rank in a sliding-window layer (SGLang's get_swa_num_kv_heads)",
    ),
    DerivedFact(
        "attn_heads_split_evenly",
        FactType("bool"),
        "query heads divide by attn_tp_size, and KV heads divide by it or it by them, in the full and the "
        "sliding-window layers",
        lambda t: t.all(
            _splits(t, t["num_attention_heads"], _kv_heads(t, "num_key_value_heads")),
            _splits(t, t["swa_num_attention_heads"], _kv_heads(t, "swa_num_key_value_heads")),
        ),
    ),
    DerivedFact(
        "dp_divides_tp",
        FactType("bool"),
        "tp_size is a multiple of dp_size",
        lambda t: t["tp_size"] % t["dp_size"] == 0,
    ),
    DerivedFact(
        "attn_cp_divides_tp",
        FactType("bool"),
        "attn_cp_size divides tp_size / dp_size under DP attention, else tp_size",
        lambda t: t["attn_dp_group_size"] % t["attn_cp_size"] == 0,
    ),
    DerivedFact(
        "attention_chunk_fits_page",
        FactType("bool"),
        "attention_chunk_size is a multiple of page_size (true without a chunk or while page_size is unset)",
        lambda t: t.if_(
            t.any(t.none("attention_chunk_size"), t.none("page_size")),
            True,
            lambda: t["attention_chunk_size"] % t["page_size"] == 0,
        ),
    ),
    DerivedFact(
        "speculative_chain_draft_tokens",
        FactType("int", None, True),
        "speculative_num_steps + 1 (a chain's draft tokens), None without speculative_num_steps",
        lambda t: t["speculative_num_steps"] + 1,
        none_when=lambda t: t.none("speculative_num_steps"),
    ),
    DerivedFact(
        "speculative_ngram_num_steps",
        FactType("int", None, True),
        "speculative_num_draft_tokens // speculative_eagle_topk (NGRAM's steps), None without both",
        lambda t: t.div(t["speculative_num_draft_tokens"], t["speculative_eagle_topk"]),
        none_when=lambda t: t.any(
            t.none("speculative_num_draft_tokens"),
            t.if_(t.none("speculative_eagle_topk"), True, lambda: t["speculative_eagle_topk"] == 0),
        ),
    ),
)


class _Values:
    """:class:`Terms` over one configuration's values."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def none(self, name: str) -> bool:
        return self.values[name] is None

    def if_(self, cond: bool, then: Lazy, other: Lazy) -> Any:
        taken = then if cond else other
        return taken() if callable(taken) else taken

    def all(self, *conds: bool) -> bool:
        return all(conds)

    def any(self, *conds: bool) -> bool:
        return any(conds)

    def div(self, a: int, b: int) -> int:
        return a // b


def derived_facts(values: dict[str, Any]) -> dict[str, Any]:
    """The derived facts of one configuration: ``values`` holds its server arguments and model facts (and may hold
    more); returns each :data:`DERIVED_FACTS` entry's value by name."""
    known = _Values(dict(values))
    out: dict[str, Any] = {}
    for fact in DERIVED_FACTS:
        none = fact.none_when is not None and fact.none_when(known)
        out[fact.name] = known.values[fact.name] = None if none else fact.value(known)
    return out


def dependencies() -> dict[str, tuple[str, ...]]:
    """Per derived fact, the derived facts its definition reads, directly or through another, in declaration order."""
    names = [fact.name for fact in DERIVED_FACTS]
    out: dict[str, tuple[str, ...]] = {}
    for fact in DERIVED_FACTS:
        reads = _reads(fact)
        closure = {dep for name in reads if name in out for dep in (*out[name], name)}
        out[fact.name] = tuple(name for name in names if name in closure)
    return out


class _Reads:
    """:class:`Terms` that notes the facts a definition reads (both branches of every choice)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def __getitem__(self, name: str) -> _Any:
        self.names.add(name)
        return _Any()

    def none(self, name: str) -> _Any:
        self.names.add(name)
        return _Any()

    def if_(self, cond: Any, then: Lazy, other: Lazy) -> _Any:
        for branch in (then, other):
            if callable(branch):
                branch()
        return _Any()

    def all(self, *conds: Any) -> _Any:
        return _Any()

    any = all

    def div(self, a: Any, b: Any) -> _Any:
        return _Any()


class _Any:
    """A value of any kind: every operation a definition uses gives another."""

    def __add__(self, other: Any) -> _Any:
        return self

    __radd__ = __mod__ = __rmod__ = __add__

    def __eq__(self, other: object) -> _Any:  # type: ignore[override]
        return self

    __ge__ = __eq__  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]


def _reads(fact: DerivedFact) -> set[str]:
    reads = _Reads()
    fact.value(reads)
    if fact.none_when is not None:
        fact.none_when(reads)
    return reads.names
