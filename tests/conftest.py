from __future__ import annotations

from pathlib import Path

import pytest

from attngate import ModelFacts, Platform, ServerArgs, load_rules, resolve

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"


def model(name: str) -> ModelFacts:
    return ModelFacts.from_hf_config(MODELS / f"{name}.json")


def resolve_flags(flags: str, model_name: str, gpu: str = "sm90"):
    return resolve(ServerArgs.from_flags(flags.split()), model(model_name), Platform.from_name(gpu))


@pytest.fixture(scope="session")
def rules():
    return load_rules()
