"""A model named as SGLang's --model-path names it: a local folder or config.json, or a Hugging Face hub id whose
config.json comes from the hub cache (offline: ``HF_HUB_OFFLINE=1``) or is fetched with huggingface_hub.

The cache is read first; a hub id it lacks costs one attempt to reach the hub, bounded by PROBE_TIMEOUT_S (or
``HF_HUB_ETAG_TIMEOUT`` where set) and never retried, so that a host without a network fails within 2 s with a clear
error instead of huggingface_hub's retries (24 s of "Retrying in 8s" lines).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attngate.errors import ModelConfigError, Problem
from attngate.util.inputs import exists

#: ``org/name`` or ``name`` with an optional ``@revision``: what huggingface_hub takes as a model repo id
_HUB_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+(?:@[\w./-]+)?$")
#: seconds the one attempt to reach the hub may take, where HF_HUB_ETAG_TIMEOUT is not set
PROBE_TIMEOUT_S = 1.2


def _is_hub_id(text: str) -> bool:
    return bool(_HUB_ID.match(text)) and not text.startswith((".", "/", "~")) and not text.endswith(".json")


def same_model(a: str | Path, b: str | Path) -> bool:
    """Whether two spellings name one model, as --model and SGLang's --model-path: local paths compared resolved
    (``..``, links, a folder and its config.json), hub ids as text."""

    def key(model: str | Path) -> tuple[str, str]:
        path = Path(model)
        if not exists(path) and not isinstance(model, Path) and _is_hub_id(str(model)):
            return "hub", str(model)
        try:
            path = path.resolve()
            path = path / "config.json" if path.is_dir() else path
        except (OSError, RuntimeError, ValueError):  # a loop of links, a name too long: compared as written
            pass
        return "path", str(path)

    return key(a) == key(b)


def config_path(model: str | Path) -> Path:
    """The config.json (or its folder) that ``model`` names: a path that exists, or anything that cannot be a hub id,
    as it is; else a hub id's cached or fetched config.json. Raises ModelConfigError naming the id, the cache it
    looked in and ``HF_HUB_OFFLINE`` when neither works."""
    path = Path(model)
    if exists(path) or isinstance(model, Path):
        return path
    text = str(model)
    if not _is_hub_id(text):
        return path  # not a hub id: reading it names the path and why it cannot be read
    with _no_telemetry():
        return _cached_or_fetched(text)


@contextmanager
def _no_telemetry() -> Iterator[None]:
    """huggingface_hub 2.x builds its user agent with an agent-detection registry fetched from the hub (a 3 s timeout,
    on every call, a cache read included) unless telemetry is off: off for these calls, so that neither a cache read
    nor the one attempt below waits on it."""
    from huggingface_hub import constants

    saved = constants.HF_HUB_DISABLE_TELEMETRY
    constants.HF_HUB_DISABLE_TELEMETRY = True
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_TELEMETRY = saved


def _cached_or_fetched(text: str) -> Path:
    repo_id, _, revision = text.partition("@")
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:  # the cache first: a cached config needs no network round trip
        return Path(hf_hub_download(repo_id, "config.json", revision=revision or None, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise ModelConfigError(
            Problem(text, f"cannot read config.json from the hub cache: {err}", code="model-config.hub-cache")
        ) from None
    missing = f"config.json is not in the hub cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise ModelConfigError(
            Problem(
                text,
                f"{missing} and HF_HUB_OFFLINE is set; unset it to fetch it, or pass the model's local folder",
                code="model-config.hub-offline",
            )
        )
    timeout = _timeout()
    unreachable = _probe(repo_id, revision or None, timeout)
    if isinstance(unreachable, HfHubHTTPError):  # the hub answered: no such repo or file, gated, bad revision
        raise ModelConfigError(
            Problem(
                text,
                f"cannot fetch config.json from the hub: {_first_line(unreachable)}",
                code="model-config.hub-refused",
            )
        )
    if unreachable is not None:
        raise ModelConfigError(
            Problem(
                text,
                f"{missing} and the hub ({constants.ENDPOINT}) could not be reached in one attempt of {timeout:g} s "
                f"({_first_line(unreachable)}); pass the model's local folder, or run where the hub is reachable "
                "(HF_HUB_OFFLINE=1 reads the cache only; HF_HUB_ETAG_TIMEOUT=S waits longer)",
                code="model-config.hub-unreachable",
            )
        )
    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=revision or None, etag_timeout=timeout))
    except (HfHubHTTPError, OSError, ValueError) as err:  # gated, missing repo, bad revision, unwritable cache
        raise ModelConfigError(
            Problem(text, f"cannot fetch config.json from the hub: {_first_line(err)}", code="model-config.hub-refused")
        ) from None


def _timeout() -> float:
    try:
        return max(float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or PROBE_TIMEOUT_S), 0.1)
    except ValueError:
        return PROBE_TIMEOUT_S


def _probe(repo_id: str, revision: str | None, timeout: float) -> BaseException | None:
    """One HEAD of the config's URL, no retry (get_hf_file_metadata retries only when asked), in a thread joined
    within ``timeout``: a name lookup that hangs counts against it too. None when the hub answered with the file."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            get_hf_file_metadata(hf_hub_url(repo_id, "config.json", revision=revision), timeout=timeout)
            outcome.append(None)
        except Exception as err:  # reported to the caller, which names it
            outcome.append(err)

    thread = threading.Thread(target=attempt, name="attngate-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.1)
    return outcome[0] if outcome else TimeoutError(f"no answer within {timeout:g} s")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}"
