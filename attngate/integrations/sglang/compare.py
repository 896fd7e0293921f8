"""One configuration through SGLang and through resolve(), and every difference between them.

Compared: every attngate ServerArgs field, as SGLang resolved it and as the Plan's adjusted arguments
hold it, plus acceptance (one side refuses). Where attngate leaves a field unset because SGLang's value
depends on what attngate does not model (GPU memory, the model's context length), :data:`UNSET_MEANS`
says which SGLang values that unset stands for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from attngate.engine.resolve import resolve
from attngate.errors import AttngateError, PlanError
from attngate.facts.model import ModelFacts
from attngate.facts.platform import Platform
from attngate.integrations.sglang.fields import attngate_values
from attngate.rules.deviations import (
    REFUSAL,
    SGLANG_REFUSAL,
    matching_deviations,
    refusing_rules,
)
from attngate.rules.ruleset import RuleSet

#: None in these means "the attention backend's"; both sides are compared with that filled in.
_EFFECTIVE = _PHASES = ("prefill_attention_backend", "decode_attention_backend")
#: Fields attngate leaves unset where SGLang derives a value from what attngate does not model; the
#: predicate says which SGLang values that unset agrees with.
UNSET_MEANS: dict[str, Callable[[Any], bool]] = {
    # SGLang sizes it from GPU memory (8192/16384...); -1 (chunked prefill off) is a decision attngate must make
    "chunked_prefill_size": lambda v: v is None or v > 0,
    "context_length": lambda v: True,  # the model's own maximum
    "max_running_requests": lambda v: True,  # from the KV pool size
    "sampling_backend": lambda v: True,  # not an attention decision
    "dtype": lambda v: True,  # "auto": the checkpoint's dtype, which SGLang reads off the weights' config
    "speculative_draft_model_path": lambda v: True,  # SGLang fills in the target model (MTP heads live in it)
}
#: Fields compared only where they decide something: the predicate, given both sides' values, says where not.
NOT_DECIDING: dict[str, Callable[[dict[str, Any], dict[str, Any]], bool]] = {
    # the DFLASH draft's block size and backend come from the draft model's own config.json, which attngate does
    # not read (it plans the target model's attention; the draft worker is SGLang's)
    "speculative_num_draft_tokens": lambda sglang, mine: mine["speculative_algorithm"] == "DFLASH",
    "speculative_draft_attention_backend": lambda sglang, mine: mine["speculative_algorithm"] == "DFLASH",
    # where attngate sets a prefill and a decode backend, its attention_backend runs neither phase: what SGLang's
    # runs is compared through the effective prefill and decode backends
    "attention_backend": lambda sglang, mine: all(mine[k] is not None for k in _PHASES),
}


class Verdict(str, Enum):
    AGREE = "agree"
    DEVIATION = "declared deviation"
    BOTH_REFUSE = "both refuse"
    ONE_REFUSES = "only one refuses"
    DISAGREE = "undeclared disagreement"


@dataclass
class CaseResult:
    """Both sides of one case. ``sglang``/``attngate`` hold the compared fields (attngate's names) or are None
    where that side refused; ``differences`` maps a field (or ``refusal``) to (SGLang's, attngate's) value;
    ``declared`` maps a differing field to the deviation ids that declare it; ``origins`` says which rule set
    each of attngate's differing values ("as given": no rule changed it) and, for attngate's refusal of what SGLang
    serves, the rules that refused (comma-separated); where attngate refused SGLang's default backend and ran another
    (a fallback), each differing value's origin is the rules that refused the default."""

    name: str
    sglang: dict[str, Any] | None
    attngate: dict[str, Any] | None
    sglang_refusal: str | None = None
    attngate_refusal: str | None = None
    differences: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    declared: dict[str, list[str]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    resolution: Any = field(default=None, repr=False)  # attngate's Resolution, where the caller asked to keep it

    @property
    def verdict(self) -> Verdict:
        undeclared = [f for f in self.differences if not self.declared.get(f)]
        if undeclared:  # before anything else: a difference is never scored as agreement
            return Verdict.ONE_REFUSES if {REFUSAL, SGLANG_REFUSAL} & set(undeclared) else Verdict.DISAGREE
        if self.sglang is None and self.attngate is None:
            return Verdict.BOTH_REFUSE
        return Verdict.DEVIATION if self.differences else Verdict.AGREE

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict.value,
            "sglang": self.sglang,
            "attngate": self.attngate,
            "sglang_refusal": self.sglang_refusal,
            "attngate_refusal": self.attngate_refusal,
            "differences": {k: list(v) for k, v in self.differences.items()},
            "declared": self.declared,
            "origins": self.origins,
        }


def _effective(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, **{k: values[k] or values["attention_backend"] for k in _EFFECTIVE}}


#: attngate's "unset" of fields whose unset is not None.
_UNSET_VALUE = {"dtype": "auto"}


def _same(name: str, sglang_value: Any, attngate_value: Any) -> bool:
    if attngate_value == _UNSET_VALUE.get(name) and name in UNSET_MEANS:
        return UNSET_MEANS[name](sglang_value)
    return sglang_value == attngate_value


def unreadable_config(
    name: str, resolved: dict[str, Any] | None, sglang_refusal: str | None, problems: str
) -> CaseResult:
    """A case whose model config attngate cannot read (``problems``): where SGLang serves it (``resolved``), an
    undeclared refusal carrying SGLang's values; where SGLang refuses it too, both refuse."""
    sglang = _effective(attngate_values(resolved)) if resolved is not None else None
    result = CaseResult(name, sglang, None, sglang_refusal=sglang_refusal, attngate_refusal=problems)
    if sglang is not None:
        result.differences[REFUSAL] = (None, problems)
        result.origins[REFUSAL] = "config reader"
    return result


def compare_case(
    name: str,
    given: dict[str, Any],
    resolved: dict[str, Any] | None,
    sglang_refusal: str | None,
    model: ModelFacts,
    platform: Platform,
    rules: RuleSet,
    *,
    keep: bool = False,
) -> CaseResult:
    """Resolve the arguments SGLang was given (``given``, SGLang's names) with attngate and compare with SGLang's
    ``resolved`` values (None: SGLang refused with ``sglang_refusal``)."""
    from attngate.facts.server_args import ServerArgs

    sglang = _effective(attngate_values(resolved)) if resolved is not None else None
    result = CaseResult(name, sglang, None, sglang_refusal=sglang_refusal)
    args = None
    refused_by: frozenset[str] = frozenset()
    fallback: frozenset[str] = frozenset()  # the rules through which attngate refused SGLang's default backend
    try:
        args = ServerArgs.from_mapping(attngate_values(given), source="sglang")
        resolution = resolve(args, model, platform, rules)
        if resolution.default_refusal is not None:
            fallback = refusing_rules(list(resolution.default_refusal[1]))
            if sglang is None:  # SGLang refuses; attngate runs another backend: scored as refusing that default
                raise PlanError(list(resolution.default_refusal[1]))
    except PlanError as err:
        result.attngate_refusal = "; ".join(f"{v.where}: {v.message}" for v in err.violations)
        refused_by = refusing_rules(err.violations)
    except AttngateError as err:
        result.attngate_refusal = "; ".join(str(p) for p in err.problems)
    else:
        result.attngate = _effective(resolution.server_args.model_dump())
        result.resolution = resolution if keep else None
        by_field = {a.field: a.rule for a in resolution.adjustments}
    deviations = matching_deviations(rules, args, model, platform, refused_by) if args is not None else {}
    if (sglang is None) != (result.attngate is None):
        result.differences[REFUSAL if sglang is not None else SGLANG_REFUSAL] = (
            sglang_refusal,
            result.attngate_refusal,
        )
        if sglang is not None and refused_by:  # the rules whose refusal SGLang does not make
            result.origins[REFUSAL] = ", ".join(sorted(refused_by))
    elif sglang is not None and result.attngate is not None:
        raw_sglang, raw_mine = attngate_values(resolved), resolution.server_args.model_dump()
        for key, value in result.attngate.items():
            if key in NOT_DECIDING and NOT_DECIDING[key](raw_sglang, raw_mine):
                continue
            if not _same(key, sglang[key], value):
                result.differences[key] = (sglang[key], value)
                result.origins[key] = by_field.get(key, "as given")
        if fallback and result.differences:
            # attngate refused SGLang's default (and runs another backend, whose values differ from SGLang's): each
            # difference is declared where the refusal deviations name the rules that refused the default, as
            # attngate's refusal of it would be; a fallback landing on SGLang's own values is an agreement
            refused = matching_deviations(rules, args, model, platform, fallback).get(REFUSAL, [])
            for key in result.differences:
                result.origins[key] = ", ".join(sorted(fallback))  # the rules that refused SGLang's default
                if refused:
                    deviations = {**deviations, key: [*deviations.get(key, []), *refused]}
    for key in result.differences:
        # a deviation of attention_backend covers the prefill and decode backends it stands for
        covering = deviations.get(key) or (
            deviations.get("attention_backend")
            if key in _EFFECTIVE and "attention_backend" in result.differences
            else None
        )
        if covering:
            result.declared[key] = covering
    return result
