"""Bounded readers for every file attngate takes (config.json, rules files, args files, plans).

Each turns what can go wrong with a file into a Problem of the caller's error type, never a bare
OSError, UnicodeDecodeError or RecursionError, and bounds size and nesting before any parser
recurses over the input.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from attngate.errors import AttngateError, Problem

MAX_FILE_BYTES = 16 << 20  # the largest config.json on the Hub is a few hundred KiB
MAX_NESTING = 64  # real configs nest 3 to 4 deep; Python's parsers recurse per level


def is_directory(path: Path) -> bool:
    """Whether ``path`` is a directory; False where it cannot be examined (a name too long...), so that reading
    it then reports why."""
    try:
        return stat.S_ISDIR(path.stat().st_mode)
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return False


def exists(path: Path) -> bool:
    """Whether anything is at ``path``; False where it cannot be examined (a name too long...)."""
    try:
        path.stat()
    except (OSError, ValueError):
        return False
    return True


#: open without waiting (a FIFO's open blocks until a writer comes) and without taking a terminal as ours
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def read_text(path: str | Path, error: type[AttngateError], what: str) -> str:
    """The UTF-8 text of ``path``; ``error`` naming the path for a missing, unreadable, oversized or undecodable file,
    a directory, or anything but a regular file (FIFOs, devices, sockets), and for every OSError (a name too long).
    What is read is what was checked: the file is opened without blocking and its descriptor examined, so a FIFO or
    device swapped in after any earlier look at the path is refused, never waited on."""
    path = Path(path)
    try:
        if is_directory(path):  # before opening: a directory does not open everywhere
            raise error(Problem(str(path), f"is a directory, not a {what}", code="input.is-directory"))
        fd = os.open(path, _OPEN_FLAGS)
        with open(fd, "rb", closefd=True) as handle:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise error(Problem(str(path), f"is a directory, not a {what}", code="input.is-directory"))
            if not stat.S_ISREG(mode):  # a FIFO would wait for a writer to come; a device never ends
                raise error(
                    Problem(
                        str(path),
                        f"is not a regular file (a FIFO, device or socket), not a {what}",
                        code="input.not-regular-file",
                    )
                )
            data = handle.read(MAX_FILE_BYTES + 1)  # bounded (it may grow while read); O_NONBLOCK: no effect here
        if len(data) > MAX_FILE_BYTES:
            raise error(
                Problem(str(path), f"more than the {MAX_FILE_BYTES} bytes a {what} may have", code="input.too-large")
            )
    except OSError as exc:
        raise error(
            Problem(str(path), f"cannot read the {what}: {exc.strerror or exc}", code="input.unreadable")
        ) from None
    except ValueError as exc:  # a NUL byte in the name: the OS takes no such path
        raise error(Problem(repr(str(path)), f"cannot read the {what}: {exc}", code="input.unreadable")) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(
            Problem(f"{path}:{line}:{col}", f"not UTF-8 text (byte 0x{data[exc.start]:02x})", code="input.not-utf8")
        ) from None


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting of JSON or flow-style YAML text, outside double-quoted strings (an upper
    bound for YAML, whose single quotes double as apostrophes in plain scalars)."""
    depth = deepest = 0
    quoted = escaped = False
    for ch in text:
        if quoted:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_json(text: str, source: str, error: type[AttngateError], *, unique_keys: bool = False) -> Any:
    """``json.loads`` with nesting bounded and, with ``unique_keys``, duplicate keys an error."""
    if nesting_depth(text) > MAX_NESTING:
        raise error(Problem(source, f"nested more than {MAX_NESTING} levels deep", code="input.too-deep"))
    duplicates: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                duplicates.append(key)
            out[key] = value
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs if unique_keys else None)
    except json.JSONDecodeError as exc:
        raise error(
            Problem(f"{source}:{exc.lineno}:{exc.colno}", f"not JSON: {exc.msg}", code="input.json-syntax")
        ) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more digits than Python converts
        raise error(Problem(source, f"not JSON: {exc}", code="input.json-syntax")) from None
    if duplicates:
        raise error([Problem(source, f"duplicate key {key!r}", code="input.duplicate-key") for key in duplicates])
    return data
