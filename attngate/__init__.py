"""attngate: declarative attention gating for LLM inference servers.

At server start-up::

    from attngate import ModelFacts, Platform, ServerArgs, resolve

    resolution = resolve(ServerArgs.from_object(sglang_server_args),
                         ModelFacts.from_hf_config(model_path), Platform.detect())
    plan = resolution.plan  # frozen; hand it to the attention backend

Nothing here imports torch or a kernel package.
"""

from __future__ import annotations

from attngate.engine.resolve import resolve
from attngate.engine.result import Resolution
from attngate.errors import (
    AttngateError,
    ModelConfigError,
    PlanError,
    PlatformError,
    RulesError,
    ServerArgsError,
    UsageError,
)
from attngate.facts.model import ModelFacts
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.plan.schema import Plan
from attngate.rules.load import load_rules
from attngate.rules.ruleset import RuleSet

__all__ = [
    "AttngateError",
    "ForwardMode",
    "LayerKind",
    "ModelConfigError",
    "ModelFacts",
    "Plan",
    "PlanError",
    "Platform",
    "PlatformError",
    "Resolution",
    "RuleSet",
    "RulesError",
    "ServerArgs",
    "ServerArgsError",
    "UsageError",
    "load_rules",
    "resolve",
]
