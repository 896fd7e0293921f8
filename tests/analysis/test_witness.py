"""simplest_witness (attngate.analysis.prove): the witness lint, diff and the invariant prover show satisfies the
query, sets the fewest server arguments away from their defaults (none of them can go back alone), and which ones does not
depend on what z3 did before in the process (a CI run once showed 22 arguments where a lone run showed 9)."""

from __future__ import annotations

import z3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attngate.analysis.encoding import Encoder
from attngate.analysis.prove import simplest_witness, witness_inputs
from attngate.facts.server_args import ServerArgs
from attngate.rules.load import load_rules

ENC = Encoder(load_rules())
FLAGS = sorted(n for n, f in ServerArgs.model_fields.items() if f.annotation is bool and n in ENC.types)


def flipped(name: str) -> object:
    return ENC.equals(name, not ServerArgs.model_fields[name].default)


#: a query: a disjunction of conjunctions, each of server flags set away from their defaults
queries = st.lists(st.lists(st.sampled_from(FLAGS), min_size=1, max_size=3, unique=True), min_size=1, max_size=3)


def witness_of(query: list[list[str]]) -> tuple[z3.Solver, list, dict]:
    solver = z3.Solver()
    solver.add(*ENC.axioms)
    terms = [z3.Or(*(z3.And(*(flipped(n) for n in conj)) for conj in query))]
    s = z3.Solver()
    s.add(*solver.assertions(), *terms, *ENC.links)
    assert s.check() == z3.sat
    shown = witness_inputs(ENC, simplest_witness(solver, ENC, terms, s.model(), set()), set())
    return solver, terms, shown


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries)
def test_the_witness_satisfies_the_query_sets_the_fewest_flags_and_none_can_go_back_alone(query):
    solver, terms, shown = witness_of(query)
    assert any(all(shown.get(n) == (not ServerArgs.model_fields[n].default) for n in conj) for conj in query)
    assert len(shown) <= min(len(conj) for conj in query)
    at_default = [
        ENC.equals(n, f.default) for n, f in ServerArgs.model_fields.items() if n in ENC.types and n not in shown
    ]
    for name in shown:
        back = z3.Solver()
        back.add(
            *solver.assertions(),
            *terms,
            *ENC.links,
            *at_default,
            ENC.equals(name, ServerArgs.model_fields[name].default),
        )
        assert back.check() == z3.unsat, f"{name} could keep its default: {shown}"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries, st.integers(0, 200))
def test_the_flags_a_witness_sets_are_the_same_after_unrelated_solver_work(query, noise):
    first = set(witness_of(query)[2])
    busy = z3.Solver()  # new terms and a search in the shared context: other ids, other learned state
    xs = [z3.Int(f"noise{noise}_{i}") for i in range(20)]
    busy.add(*(x > y for x, y in zip(xs, xs[1:])), z3.Sum(xs) == noise)
    busy.check()
    assert set(witness_of(query)[2]) == first
