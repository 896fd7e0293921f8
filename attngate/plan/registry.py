"""The gate registry: every gate a rule may set, with its scope, type, default and location in the Plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from attngate.plan.schema import (
    CommonGates,
    FlashAttentionGates,
    FlashInferGates,
    LayerGates,
    ModeGates,
)
from attngate.types import FactType, Scope


@dataclass(frozen=True, slots=True)
class GateSpec:
    name: str  # e.g. "fa.skip_kv_cache"
    scope: Scope
    group: str  # the Plan attribute and the rules' prefix: fa | flashinfer | common
    field: str
    type: FactType
    default: Any
    from_fact: str | None
    doc: str
    read_by: tuple[str, ...]  # the backends that read it (attention_backend names); empty: every backend


def _specs(scope: Scope, groups: dict[str, type[BaseModel]]) -> list[GateSpec]:
    out = []
    for group, model in groups.items():
        for field, info in model.model_fields.items():
            extra = info.json_schema_extra or {}
            out.append(
                GateSpec(
                    name=f"{group}.{field}",
                    scope=scope,
                    group=group,
                    field=field,
                    type=FactType.from_field(info),  # with its domain (ge/le)
                    default=info.default,
                    from_fact=extra.get("from_fact"),
                    doc=info.description or "",
                    read_by=model.read_by,
                )
            )
    return out


def _group_models(row: type[BaseModel]) -> dict[str, type[BaseModel]]:
    return {name: info.annotation for name, info in row.model_fields.items()}  # type: ignore[misc]


def _build() -> dict[str, GateSpec]:
    specs = [
        *_specs("global", {"fa": FlashAttentionGates, "flashinfer": FlashInferGates, "common": CommonGates}),
        *_specs("mode", _group_models(ModeGates)),
        *_specs("layer", _group_models(LayerGates)),
    ]
    registry: dict[str, GateSpec] = {}
    for spec in specs:
        if spec.name in registry:
            raise AssertionError(f"gate {spec.name} declared twice")
        if not spec.type.accepts(spec.default):
            raise AssertionError(f"gate {spec.name}: its default {spec.default!r} is outside its domain")
        registry[spec.name] = spec
    return registry


GATES: dict[str, GateSpec] = _build()
