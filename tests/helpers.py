"""Shared test helpers (a module of its own: tests/ and tests/gpu/ each have a conftest)."""

from __future__ import annotations

from pathlib import Path

from attngate import ModelFacts, Platform, ServerArgs, resolve

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"


def model(name: str) -> ModelFacts:
    return ModelFacts.from_hf_config(MODELS / f"{name}.json")


def fa3_gpu(name: str = "sm90") -> Platform:
    """A GPU host with FlashAttention-3 installed (so `fa3` runs through flash_attn_interface)."""
    return Platform.from_name(name, has_flash_attn_interface=True)


def resolve_flags(flags: str, model_name: str, gpu: str = "sm90"):
    return resolve(ServerArgs.from_flags(flags.split()), model(model_name), fa3_gpu(gpu))

