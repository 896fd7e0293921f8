"""A model named as SGLang's --model-path names it: a local folder or config.json, or a Hugging Face hub id whose
config.json comes from the hub cache (offline: ``HF_HUB_OFFLINE=1``) or is fetched with huggingface_hub."""

from __future__ import annotations

import re
from pathlib import Path

from attngate.errors import ModelConfigError, Problem
from attngate.util.inputs import exists

#: ``org/name`` or ``name`` with an optional ``@revision``: what huggingface_hub takes as a model repo id
_HUB_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+(?:@[\w./-]+)?$")


def config_path(model: str | Path) -> Path:
    """The config.json (or its folder) that ``model`` names: a path that exists, or anything that cannot be a hub id,
    as it is; else a hub id's cached or fetched config.json. Raises ModelConfigError naming the id, the cache it
    looked in and ``HF_HUB_OFFLINE`` when neither works."""
    path = Path(model)
    if exists(path) or isinstance(model, Path):
        return path
    text = str(model)
    if not _HUB_ID.match(text) or text.startswith((".", "/", "~")) or text.endswith(".json"):
        return path  # not a hub id: reading it names the path and why it cannot be read
    repo_id, _, revision = text.partition("@")
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:  # the cache first: a cached config needs no network round trip
        return Path(hf_hub_download(repo_id, "config.json", revision=revision or None, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise ModelConfigError(Problem(text, f"cannot read config.json from the hub cache: {err}")) from None
    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=revision or None))
    except LocalEntryNotFoundError:
        offline = constants.HF_HUB_OFFLINE
        raise ModelConfigError(
            Problem(
                text,
                f"config.json is not in the hub cache ({constants.HF_HUB_CACHE})"
                + (
                    " and HF_HUB_OFFLINE is set; unset it to fetch it, or pass the model's local folder"
                    if offline
                    else " and the hub could not be reached; pass the model's local folder, or run where the hub "
                    "is reachable (HF_HUB_OFFLINE=1 reads the cache only)"
                ),
            )
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as err:  # gated, missing repo, bad revision, unwritable cache
        raise ModelConfigError(Problem(text, f"cannot fetch config.json from the hub: {err}")) from None
