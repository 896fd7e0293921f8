"""Lint of the rule file's ``deviations:`` beyond "can it hold" and "do two overlap" (attngate.analysis.lint): a
deviation that excuses too much.

- A deviation declaring value fields or ``sglang_refusal`` whose ``when`` holds for every input the schema allows
  (its negation unsatisfiable) would excuse every such difference of every configuration: ``verify()`` would pass
  any backend SGLang chose against the Plan's. Loading refuses the literal ``when: true`` (and a left-out ``when``);
  this finds the rest (``page_size > 0``, ``x or not x``). A refusal deviation may hold everywhere: the rules it
  names bound it (loading checks that each can refuse).

A query z3 cannot decide is an :class:`~attngate.analysis.verdict.Unknown`, never read as proved either way.
"""

from __future__ import annotations

import z3

from attngate.analysis.encoding import Encoder, Finding, can_hold
from attngate.analysis.prove import inputs_read
from attngate.analysis.verdict import Unknown
from attngate.rules.deviations import REFUSAL
from attngate.rules.ruleset import RuleSet


def lint_tautologies(rules: RuleSet, enc: Encoder, solver: z3.Solver) -> list[Finding | Unknown]:
    """A Finding per deviation of value fields or ``sglang_refusal`` whose condition holds for every input (``solver``
    holds the encoding's axioms), an Unknown per one z3 cannot decide."""
    findings: list[Finding | Unknown] = []
    for deviation in rules.deviations:
        excused = [f for f in deviation.fields if f != REFUSAL]
        if not excused:
            continue
        reads = inputs_read([rules], [], deviation.condition.reads, through_gates=False)
        verdict = can_hold(solver, enc, z3.Not(enc.encode(deviation.condition.tree.body)), reads)
        if verdict.unsat:
            findings.append(
                Finding(
                    deviation.where,
                    f"deviation {deviation.id!r} holds for every configuration: it would excuse every difference of "
                    f"{', '.join(excused)}; state in `when` the configurations it covers",
                    "lint.deviation-tautology",
                )
            )
        elif verdict.unknown:
            findings.append(
                Unknown(
                    deviation.where, f"does deviation {deviation.id!r} hold for every configuration", verdict.reason
                )
            )
    return findings
