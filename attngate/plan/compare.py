"""Gate-by-gate comparison of two plans (no torch: used by the distributed consistency check and by
anyone comparing plans resolved on two hosts)."""

from __future__ import annotations

from typing import Any

from attngate.plan.schema import Plan


def gate_values(plan: Plan) -> dict[str, Any]:
    """Every value of the plan under its rule-file name: ``fa.num_splits``, ``decode: fa.kv_extent``,
    ``sliding_window: common.use_window``, plus ``prefill_backend`` / ``decode_backend``."""
    body = plan.model_dump(mode="json", exclude={"fingerprint"})
    out: dict[str, Any] = {"prefill_backend": body.pop("prefill_backend"), "decode_backend": body.pop("decode_backend")}
    tables = {"modes": body.pop("modes"), "layers": body.pop("layers")}
    _groups("", body, out)
    for rows in tables.values():
        for key, groups in rows.items():
            _groups(f"{key}: ", groups, out)
    return out


def _groups(prefix: str, groups: dict[str, dict[str, Any]], out: dict[str, Any]) -> None:
    for group, fields in groups.items():
        for name, value in fields.items():
            out[f"{prefix}{group}.{name}"] = value


def differing(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ (a key missing on one side counts), as ``{key: (a_value, b_value)}``."""
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}
