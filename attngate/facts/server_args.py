"""``ServerArgs``: the attention-relevant SGLang server arguments, with SGLang's names and defaults.

Build one from CLI flags in SGLang's spelling (:meth:`ServerArgs.from_flags`), from a YAML/JSON
args file (:meth:`ServerArgs.from_file`), or from any object carrying those attributes, such as
SGLang's own ``ServerArgs`` (:meth:`ServerArgs.from_object`). Every problem is reported at once in a
:class:`~attngate.errors.ServerArgsError`, naming the flag or key, with a did-you-mean suggestion.
"""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string at
# import, a few ms of a cold `attngate explain` over the models of this module (issue 53 item 9)

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from attngate.errors import Problem, ServerArgsError, UsageError, check_arguments
from attngate.facts.choices import (
    AttentionBackendName,
    DisaggregationMode,
    DraftAttentionBackendName,
    HicacheIoBackend,
    KvCacheDtype,
    ModelDtype,
    SamplingBackend,
    SpeculativeAlgorithm,
    SpeculativeAttentionMode,
)
from attngate.util.inputs import parse_json, read_text
from attngate.util.suggest import suggestion
from attngate.util.validated import ValidatedModel


class ServerArgs(ValidatedModel):
    """Attention-relevant SGLang server arguments (field names, types and defaults as in SGLang).

    ``None`` means "unset": the rules fill it (e.g. the default attention backend, R2..R8).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    error = ServerArgsError

    @field_validator("*", mode="before")
    @classmethod
    def _integers_are_integers(cls, value: Any, info: ValidationInfo) -> Any:
        """An integer argument takes an integer (or its decimal string, as a flag gives it): not a bool, a float or
        "2.0", which pydantic would otherwise read as 1 or 2."""
        if _INT_FIELDS.get(info.field_name) and (
            isinstance(value, (bool, float)) or (isinstance(value, str) and not value.strip().lstrip("+-").isdigit())
        ):
            raise ValueError("takes an integer")
        return value

    attention_backend: Optional[AttentionBackendName] = None
    prefill_attention_backend: Optional[AttentionBackendName] = None
    decode_attention_backend: Optional[AttentionBackendName] = None
    speculative_draft_attention_backend: Optional[DraftAttentionBackendName] = None
    kv_cache_dtype: KvCacheDtype = "auto"
    page_size: Optional[int] = Field(
        None, ge=1, le=1 << 16, description="tokens per KV page (at most 65536: no kernel pages more)"
    )
    context_length: Optional[int] = Field(None, ge=1, le=1 << 40, description="tokens")
    dtype: ModelDtype = "auto"
    is_embedding: bool = False
    prefill_only_disable_kv_cache: bool = Field(
        False, description="embedding servers: a no-op KV pool, nothing written or read"
    )
    enable_mis: bool = Field(
        False, description="multi-item scoring: several items per request, scored against its prompt"
    )
    chunked_prefill_size: Optional[int] = Field(None, ge=-1, le=1 << 40, description="tokens; -1 disables")
    disable_radix_cache: bool = False
    disable_chunked_prefix_cache: bool = False
    enable_mixed_chunk: bool = False
    disable_hybrid_swa_memory: bool = False
    enable_hierarchical_cache: bool = False
    enable_unified_memory: bool = Field(
        False, description="one KV memory pool for all layer kinds, read through translated indices"
    )
    hicache_io_backend: HicacheIoBackend = "kernel"
    tp_size: int = Field(1, ge=1, le=1 << 16)
    dp_size: int = Field(1, ge=1, le=1 << 16)
    enable_dp_attention: bool = False
    enable_dp_lm_head: bool = Field(False, description="vocabulary-parallel LM head within each attention DP group")
    enable_prefill_cp: bool = False
    attn_cp_size: int = Field(1, ge=1, le=1 << 16, description="attention context-parallel ranks")
    enable_hisparse: bool = Field(
        False, description="HiSparse: sparse attention over a KV pool of its own (DSA models)"
    )
    max_running_requests: Optional[int] = Field(None, ge=1, le=1 << 20, description="requests in flight at once")
    speculative_algorithm: Optional[SpeculativeAlgorithm] = None
    speculative_num_steps: Optional[int] = Field(None, ge=0, le=1024)
    speculative_eagle_topk: Optional[int] = Field(None, ge=0, le=1024)
    speculative_num_draft_tokens: Optional[int] = Field(None, ge=1, le=1 << 16)
    speculative_draft_model_path: Optional[str] = None
    speculative_attention_mode: SpeculativeAttentionMode = "prefill"
    speculative_ngram_max_bfs_breadth: int = Field(10, ge=1, le=1024)
    speculative_use_rejection_sampling: bool = Field(
        False, description="EAGLE: accept draft tokens by rejection sampling"
    )
    speculative_accept_threshold_single: float = Field(1.0, ge=0.0, le=1.0)
    speculative_accept_threshold_acc: float = Field(1.0, ge=0.0, le=1.0)
    enable_deterministic_inference: bool = False
    rl_on_policy_target: Optional[str] = None
    disable_cuda_graph: bool = False
    enable_piecewise_cuda_graph: bool = False
    enable_torch_compile: bool = False
    sampling_backend: Optional[SamplingBackend] = None
    flashinfer_mla_disable_ragged: bool = False
    disaggregation_mode: DisaggregationMode = "null"

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_mapping(
        cls, data: dict[str, Any], *, source: str = "args", locate: Callable[[Any], str] | None = None
    ) -> "ServerArgs":
        """Validate a mapping (keys in snake_case or kebab-case). Raises ServerArgsError naming each key
        (``locate(key)``, default ``"{source}: {key}"``); one argument spelled twice is an error. UsageError for a
        ``data`` that is no mapping."""
        check_arguments(("data", data, Mapping, "a mapping of argument names to values; flags go to from_flags"))
        locate = locate or (lambda key: f"{source}: {key}")
        problems: list[Problem] = []
        clean: dict[str, Any] = {}
        spelled: dict[str, Any] = {}
        for key, value in data.items():
            name = str(key).replace("-", "_").lstrip("_")
            if name not in cls.model_fields:
                problems.append(
                    Problem(
                        locate(key),
                        "unknown server argument",
                        help=suggestion(name, cls.model_fields),
                        code="server-args.unknown-argument",
                    )
                )
            elif name in spelled:
                problems.append(
                    Problem(
                        locate(key),
                        f"sets {name} again (also given as {spelled[name]!r})",
                        code="server-args.given-twice",
                    )
                )
            else:
                clean[name], spelled[name] = value, key
        return cls._validate(clean, problems, lambda n: locate(spelled.get(n, n)))

    @classmethod
    def from_flags(cls, argv: list[str]) -> "ServerArgs":
        """Parse an SGLang launch line as SGLang 0.5.23 does (attngate.facts.launch): ``['--tp', '2',
        '--attention-backend', 'fa3']``, aliases and unambiguous prefixes, ``--config server.yaml``, a pasted
        ``python -m sglang.launch_server`` head. Flags no rule reads (and --model-path) are accepted and not kept.
        Raises ServerArgsError listing every unknown flag, missing value and bad value.
        """
        from attngate.facts.launch import parse_launch_line

        if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)):
            raise UsageError(
                Problem(
                    "argv",
                    f"takes a list of flag strings (e.g. {'--tp-size 2'.split()!r}), not a "
                    f"{type(argv).__name__}" + ("; split it: s.split()" if isinstance(argv, str) else ""),
                    code="usage.argv",
                )
            )
        not_str = [
            f"argv[{i}]: {a!r} is a {type(a).__name__}, not a string"
            for i, a in enumerate(argv)
            if not isinstance(a, str)
        ]
        if not_str:
            raise UsageError([Problem("argv", message, code="usage.argv") for message in not_str])
        line = parse_launch_line(list(argv), cls.model_fields)
        return cls._validate(line.values, line.problems, lambda n: "--" + n.replace("_", "-"))

    @classmethod
    def from_file(cls, path: str | Path) -> "ServerArgs":
        """Load a YAML or JSON mapping of server arguments. Raises ServerArgsError (UsageError for a ``path`` of
        another type)."""
        from attngate.util.yaml_source import load_yaml

        check_arguments(("path", path, (str, Path), "the args file's path"))
        path = Path(path)
        text = read_text(path, ServerArgsError, "args file")
        locate = None
        if path.suffix == ".json":
            data = parse_json(text, str(path), ServerArgsError, unique_keys=True)
        else:  # located, duplicate keys and alias bombs rejected
            doc, problems = load_yaml(text, str(path))
            if problems:
                raise ServerArgsError(problems)
            data = doc.data
            locate = lambda key: f"{doc.where((key,))}: {key}"  # noqa: E731
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ServerArgsError(
                Problem(
                    str(path),
                    "an args file must hold a mapping of argument names to values",
                    code="server-args.file-not-mapping",
                )
            )
        return cls.from_mapping(data, source=str(path), locate=locate)

    @classmethod
    def from_object(cls, obj: object) -> "ServerArgs":
        """Read every known field from ``obj``'s attributes (e.g. SGLang's ServerArgs); extras ignored. UsageError for
        a mapping (its keys are no attributes: ``ServerArgs(**mapping)``) or an object with none of the fields, which
        would silently give SGLang's defaults."""
        if isinstance(obj, Mapping):
            raise UsageError(
                Problem(
                    "obj",
                    f"takes an object with server-argument attributes, not a {type(obj).__name__}; "
                    "for a mapping: ServerArgs(**mapping)",
                    code="usage.server-args-object",
                )
            )
        missing, data, failed = object(), {}, []
        for name in cls.model_fields:
            try:
                value = getattr(obj, name, missing)
            except Exception as exc:  # noqa: BLE001 - a property of the caller's object raised; name it, do not pass it on
                failed.append(
                    Problem(
                        f"{type(obj).__name__}.{name}",
                        f"reading it raised {type(exc).__name__}: {exc}",
                        code="server-args.attribute-raised",
                    )
                )
                continue
            if value is not missing:
                data[name] = value
        if failed:
            raise UsageError(failed)
        if not data:
            raise UsageError(
                Problem(
                    "obj",
                    f"{type(obj).__name__} has none of the server arguments as attributes "
                    "(e.g. attention_backend, page_size)",
                    code="usage.server-args-object",
                )
            )
        return cls._validate(data, [], lambda n: f"{type(obj).__name__}.{n}")

    @classmethod
    def _validate(cls, data: dict[str, Any], problems: list[Problem], where) -> "ServerArgs":
        try:
            args = cls(**data)
        except ServerArgsError as exc:
            problems += [
                Problem(where(name.split(".")[0]) if name else None, message, code="server-args.invalid-value")
                for name, message in exc.fields
            ]
            raise ServerArgsError(problems) from None
        if problems:
            raise ServerArgsError(problems)
        return args

    def non_defaults(self) -> dict[str, Any]:
        """The arguments that differ from SGLang's defaults."""
        return {k: v for k, v in self.model_dump().items() if v != type(self).model_fields[k].default}


#: Whether each field takes an integer (read off its annotation: int or Optional[int]).
_INT_FIELDS: dict[str, bool] = {
    name: info.annotation in (int, Optional[int]) for name, info in ServerArgs.model_fields.items()
}
