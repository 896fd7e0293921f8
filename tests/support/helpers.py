"""Shared test helpers (a module of its own: tests/ and tests/gpu/ each have a conftest)."""

from __future__ import annotations

import typing
from pathlib import Path

from hypothesis import strategies as st

from attngate import ModelFacts, Platform, ServerArgs, resolve
from attngate.errors import PlanError

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"


def model(name: str) -> ModelFacts:
    return ModelFacts.from_hf_config(MODELS / f"{name}.json")


def fa3_gpu(name: str = "sm90") -> Platform:
    """A GPU host with FlashAttention-3 installed (so `fa3` runs through flash_attn_interface)."""
    return Platform.from_name(name, has_flash_attn_interface=True)


def resolve_flags(flags: str, model_name: str, gpu: str = "sm90"):
    return resolve(ServerArgs.from_flags(flags.split()), model(model_name), fa3_gpu(gpu))


#: The attention keys of an EmbeddingGemma config (google/embeddinggemma-300m's shape: a Gemma3TextModel whose 24 layers
#: attend both ways, five sliding-window layers to one global).
EMBEDDING_GEMMA = {
    "architectures": ["Gemma3TextModel"],
    "model_type": "gemma3_text",
    "use_bidirectional_attention": True,
    "hidden_size": 768,
    "num_hidden_layers": 24,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "sliding_window": 512,
    "query_pre_attn_scalar": 256,
    "max_position_embeddings": 2048,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 4,
}


def embedding_gemma(**changes) -> ModelFacts:
    return ModelFacts.from_hf_dict({**EMBEDDING_GEMMA, **changes}, source="embeddinggemma")


def field_values(field) -> st.SearchStrategy:
    """Values a ServerArgs field takes: its Literal choices, booleans, or numbers inside its bounds (None where optional)."""
    annotation, optional = field.annotation, False
    if typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation, optional = args[0], True
    if typing.get_origin(annotation) is typing.Literal:
        values = st.sampled_from(typing.get_args(annotation))
    elif annotation is bool:
        values = st.booleans()
    elif annotation in (int, float):
        lo = next((m.ge for m in field.metadata if hasattr(m, "ge")), -1)
        hi = next((m.le for m in field.metadata if hasattr(m, "le")), 1 << 16)
        values = st.sampled_from(sorted({lo, min(hi, max(lo, 1)), min(hi, 16), min(hi, 4096), hi}))
    else:
        values = st.just(field.default)
    return st.none() | values if optional else values


#: Any subset of ServerArgs's fields, each at a value its type allows (hypothesis; ServerArgs may still refuse the mix).
SERVER_ARGS = st.fixed_dictionaries({}, optional={name: field_values(f) for name, f in ServerArgs.model_fields.items()})


def refusing_rules_of(call) -> set[str]:
    """The rules (and engine labels) that refuse ``call()``'s configuration: its PlanError's, or, where resolve() fell
    back from a default backend the rules refused (attngate.engine.fallback), the ones that refused that default."""
    try:
        resolution = call()
    except PlanError as err:
        return {v.where for v in err.violations}
    return {v.where for v in resolution.default_refusal[1]} if resolution.default_refusal else set()


def cache_hub_config(root: Path, repo_id: str, config_text: str) -> None:
    """Put ``config_text`` into a Hugging Face hub cache at ``root`` as ``repo_id``'s config.json (huggingface_hub's
    layout: refs/main names the snapshot), so that hub ids resolve offline in tests."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(config_text)
