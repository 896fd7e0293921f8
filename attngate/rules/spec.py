"""The schema of a rules file (pydantic); ``attngate schema`` prints it as JSON Schema for editors."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

from attngate.facts.choices import AttentionBackendName

RuleKind = Literal["set", "adjust", "forbid", "known_failure"]


class RuleSpec(BaseModel):
    """One rule as written in the file (before its condition and values are type-checked)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.\-]*$", description="unique, kebab-case; dots group related rules")
    kind: RuleKind = Field(
        "set",
        description="set: gate values; adjust: rewrite server arguments (a warning); forbid: configuration error; known_failure: a known-broken combination (error, or `fallback` adjustments)",
    )
    summary: str = Field(min_length=1, description="one line: what the rule decides")
    when: Union[StrictStr, StrictBool] = Field(description="condition over facts, a safe Python expression subset")
    backends: Optional[list[AttentionBackendName]] = Field(
        None, min_length=1, description="applies only when the prefill or the decode backend is one of these"
    )
    set_: Optional[dict[str, Any]] = Field(None, alias="set", description="kind set: {gate: value}")
    adjust: Optional[dict[str, Any]] = Field(None, description="kind adjust: {server_arg: value}")
    fallback: Optional[dict[str, Any]] = Field(
        None, description="kind known_failure: {server_arg: value} applied instead of an error"
    )
    message: Optional[str] = Field(None, description="shown to the user (required for adjust, forbid, known_failure)")
    issue: Optional[str] = Field(None, description="kind known_failure: the issue that tracks it")
    why: str = Field(min_length=1, description="the reason, for the reader of the plan")
    source: str = Field(min_length=1, description="where SGLang (or a PR/issue) makes this decision")


class InvariantSpec(BaseModel):
    """An assertion over facts and gates of any scope that must hold for every input the schema allows."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.\-]*$", description="unique among invariants")
    summary: str = Field(min_length=1, description="one line: the contract")
    assert_: str = Field(
        alias="assert",
        min_length=1,
        description="condition over facts, predicates, gates of every scope, forward_mode and layer_kind",
    )
    source: str = Field(min_length=1, description="the bug class or PR it guards against")


class RuleFileSpec(BaseModel):
    """A rules file: ``version: 1``, predicates, rules, invariants and deviations."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = Field(description="the rule language's version: the integer 1")
    predicates: dict[str, str] = Field(
        default_factory=dict,
        description="named boolean conditions that rules read like facts; each may read earlier ones",
    )
    rules: list[RuleSpec]
    invariants: list[InvariantSpec] = Field(
        default_factory=list, description="assertions `attngate lint` proves over every input (z3)"
    )
    deviations: list["DeviationSpec"] = Field(
        default_factory=list, description="deliberate differences from SGLang's resolution (`attngate conform`)"
    )

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_an_integer(cls, value: Any) -> Any:
        # Literal[1] alone would take `true` (a bool is an int) and `1.0` (equal to 1)
        if type(value) is not int:
            raise ValueError(f"version is the integer 1, not {type(value).__name__} {value!r}")
        return value


class DeviationSpec(BaseModel):
    """A deliberate difference from SGLang's own resolution, which ``attngate conform`` then accepts."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.\-]*$", description="unique among deviations")
    fields: Union[str, list[str]] = Field(
        description="the server arguments that differ from one cause, or `refusal`: one side refuses, the other accepts"
    )
    when: Union[StrictStr, StrictBool] = Field(
        True, description="condition over the configuration as given (facts before any adjust rule)"
    )
    rules: list[str] = Field(
        default_factory=list,
        description="field refusal: attngate refuses through these rules only (where SGLang accepts); empty: SGLang refuses, attngate accepts",
    )
    reason: str = Field(min_length=1, description="why attngate differs on purpose")
    source: str = Field(min_length=1, description="the PR, issue or kernel check behind the difference")

    @field_validator("fields")
    @classmethod
    def _declares_each_field_once(cls, value: Union[str, list[str]]) -> Union[str, list[str]]:
        # a deviation of no field would be dropped without a word; one listed twice is a slip
        if isinstance(value, list) and not value:
            raise ValueError("a deviation declares at least one field (a server argument, refusal or sglang_refusal)")
        twice = sorted({f for f in value if value.count(f) > 1}) if isinstance(value, list) else []
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once")
        return value

    @field_validator("rules")
    @classmethod
    def _names_each_rule_once(cls, value: list[str]) -> list[str]:
        twice = sorted({r for r in value if value.count(r) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once")
        return value


RuleFileSpec.model_rebuild()
