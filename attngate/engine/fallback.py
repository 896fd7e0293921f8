"""The default backend's fallback, and the candidates a refusal names.

SGLang 0.5.23 picks a default attention backend and starts with it even where its kernels then refuse the model
(FlashInfer MLA with kv_lora_rank 48, FA3 MLA on SM80 under deterministic inference). attngate's default chain (the
``default-backend.*`` adjust rules) picks the same backend; where the rules then refuse it, :func:`fall_back` tries
the other candidates in :data:`CANDIDATE_BACKENDS` order and resolves with the first that runs, recording why
(``default-backend.fallback``, and ``Resolution.default_refusal``). Where none runs, or the user named the backend,
the refusal lists every candidate with the rules that refuse it, and the ones that run.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from attngate.engine.result import Adjustment, Resolution, Violation
from attngate.errors import PlanError
from attngate.facts.server_args import ServerArgs
from attngate.plan.backends import CANDIDATE_BACKENDS
from attngate.rules.deviations import refusing_rules

FALLBACK_RULE = "default-backend.fallback"
_PHASES = ("prefill_attention_backend", "decode_attention_backend")


def fall_back(args: ServerArgs, err: PlanError, resolve_once: Callable[[ServerArgs], Resolution]) -> Resolution:
    """The Resolution of the first candidate backend that runs where the default backend was refused; else raises
    ``err`` again with every candidate's verdict (:attr:`PlanError.candidates`). Only where the user named neither
    backend phase; where they named ``attention_backend`` the refusal names the candidates and falls back to none."""
    if any(getattr(args, phase) is not None for phase in _PHASES):
        raise err
    chosen = next((a for a in err.adjustments if a.field == "attention_backend" and a.fills_default), None)
    default = args.attention_backend if chosen is None else chosen.new
    verdicts: dict[str, list[str]] = {}
    for backend in CANDIDATE_BACKENDS:
        if backend == default:
            verdicts[backend] = sorted(refusing_rules(err.violations))
            continue
        try:
            resolution = resolve_once(args.model_copy(update={"attention_backend": backend}))
        except PlanError as refused:
            verdicts[backend] = sorted(refusing_rules(refused.violations))
            continue
        verdicts[backend] = []
        if chosen is not None:  # the default chain's choice is refused: run the first candidate that works
            return _fallen_back(args, err, chosen, resolution)
    if len({tuple(v) for v in verdicts.values()}) > 1:  # the candidates differ: worth listing
        raise PlanError(err.violations, err.server_args, err.adjustments, err.deviations, candidates=verdicts)
    raise err


def _fallen_back(args: ServerArgs, err: PlanError, chosen: Adjustment, resolution: Resolution) -> Resolution:
    backend = resolution.server_args.attention_backend
    refused = ", ".join(sorted(refusing_rules(err.violations)))
    note = Adjustment(
        FALLBACK_RULE,
        "attention_backend",
        None,
        backend,
        f"the default, {chosen.new} ({chosen.rule}), cannot run here ({refused}); {backend} is the first candidate "
        "that can",
    )
    violations: tuple[Violation, ...] = tuple(err.violations)
    return dataclasses.replace(
        resolution,
        requested_args=args,
        adjustments=[note, *resolution.adjustments],
        deviations=err.deviations,
        default_refusal=(chosen.new, violations),
    )
