"""SGLang's own resolution of one configuration: the oracle of ``attngate conform``.

Each call resolves one ``sglang.srt.server_args.ServerArgs`` through ``resolve_once()`` on a faked GPU
(:mod:`.device`). SGLang keeps module-level state across resolutions, so run each case in a fresh
process forked after :func:`require_sglang` and :func:`.device.preload` (``attngate conform`` does).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from attngate.errors import Problem, SglangMissingError  # noqa: F401 - SglangMissingError is importable here
from attngate.facts.choices import SGLANG_VERSION

INSTALL = (
    f'pip install --no-deps sglang=={SGLANG_VERSION} && pip install "attngate[sglang]"'
    " (SGLang's own requirements would pull its GPU stack; the extra holds what its resolution imports)"
)


def require_sglang() -> str:
    """The installed SGLang version. Raises SglangMissingError naming the extra and the install command; warns
    (UserWarning) when the version is not the one rules.yaml models."""
    try:
        version = metadata.version("sglang")
        import sglang.srt.server_args  # noqa: F401
    except (metadata.PackageNotFoundError, ImportError) as err:
        raise SglangMissingError(
            Problem(
                "sglang",
                f"cannot import SGLang ({err})",
                code="sglang-missing.not-importable",
                help=f"install the sglang extra: {INSTALL}",
            )
        ) from None
    if version != SGLANG_VERSION:
        warnings.warn(
            f"attngate models SGLang {SGLANG_VERSION}; the installed sglang is {version}, so differences may be "
            "SGLang's changes rather than attngate's",
            UserWarning,
            stacklevel=2,
        )
    return version


@dataclass(frozen=True)
class SglangOutcome:
    """What SGLang made of one configuration: its resolved field values (SGLang's names; None where it
    refused), its refusal (the exception's type and message), and the arguments as given."""

    given: dict[str, Any]
    resolved: dict[str, Any] | None
    refusal: str | None


def _record_values(record: Any) -> dict[str, Any]:
    from sglang.srt.arg_groups.arg_utils import record_fields

    return {f.name: getattr(record, f.name) for f in record_fields(type(record))}


def sglang_resolve(model_dir: str | Path, gpu: str, kwargs: dict[str, Any]) -> SglangOutcome:
    """Build SGLang's ServerArgs for ``model_dir`` (a folder holding config.json) with ``kwargs`` (SGLang's
    field names) and resolve it as ``gpu`` (``sm90``...) would. An exception SGLang raises while building or
    resolving is its refusal; SGLang's log output is silenced."""
    from sglang.srt.server_args import ServerArgs as SglangServerArgs

    from attngate.integrations.sglang.device import fake_gpu

    quiet = io.StringIO()
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            warnings.simplefilter("ignore")
            try:
                record = SglangServerArgs(model_path=str(model_dir), **kwargs)
            except Exception as err:  # noqa: BLE001 - SGLang's refusal, whatever its type
                return SglangOutcome(dict(kwargs), None, _describe(err))
            given = _record_values(record)
            try:
                with fake_gpu(gpu):
                    record.resolve_once()
            except Exception as err:  # noqa: BLE001
                return SglangOutcome(given, None, _describe(err))
            return SglangOutcome(given, record.resolved_dict(), None)
    finally:
        logging.disable(previous)


def _describe(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:400]}"
