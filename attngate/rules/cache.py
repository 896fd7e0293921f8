"""A disk cache of loaded rule sets, so that a cold ``attngate explain`` unpickles the shipped rules (a few ms)
instead of parsing and type-checking them (about 110 ms).

An entry is keyed by the SHA-256 of everything the loaded RuleSet is a function of: the rules file's text and the
name its ``file:line:col`` carry, the source of the floors parsing reads (attngate/rules, plan, facts, util,
errors.py, types.py: import-linter keeps parsing from importing anything else of attngate's) and the interpreter
(compiled conditions are marshalled code). An entry holds the rule set as constructor calls (each dataclass by its
fields, each condition by its text, code and conjuncts' code, without syntax trees: attngate.rules.condition parses
those again where something reads them) and the code objects in one marshalled tuple. An edited file, an edited attngate or another Python gives another key,
never a stale rule set. Entries are written whole to a temporary file and renamed into place; one that is truncated,
corrupt (its payload's SHA-256 is checked), not the user's own, or unreadable is ignored and parsed again. Only rule
sets that load are cached: every error is reported by parsing, as before. Off with ``ATTNGATE_NO_CACHE=1``; the
folder is ``$XDG_CACHE_HOME/attngate`` (default ``~/.cache/attngate``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import marshal
import os
import pickle
import stat
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Callable

from attngate.rules.condition import Condition, restored_condition
from attngate.rules.deviations import Deviation
from attngate.rules.invariants import Invariant
from attngate.rules.ruleset import FactValue, Predicate, Rule, RuleSet

#: bump when the entry layout changes (the pickled classes themselves are covered by the source digest)
FORMAT = b"attngate-rules-cache 3\n"
#: entries kept in the folder; the least recently used are removed when a new one is written
MAX_ENTRIES = 16
#: an entry larger than this is no entry of ours (the shipped rules make about 0.6 MB)
MAX_BYTES = 64 << 20
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SOURCES = ("rules", "plan", "facts", "util", "errors.py", "types.py")
_digest: bytes | None = None


def cache_dir() -> Path | None:
    """The folder entries go in; None when caching is off or no home is known."""
    if os.environ.get("ATTNGATE_NO_CACHE"):
        return None
    base = os.environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):  # the XDG spec: a relative value is ignored
        home = os.path.expanduser("~")
        if home == "~":
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "attngate"


def source_digest() -> bytes:
    """SHA-256 of the source parsing reads (paths and contents; about 1 ms), once a process."""
    global _digest
    if _digest is None:
        h = hashlib.sha256()
        for name in _SOURCES:
            root = os.path.join(_PACKAGE, name)
            if os.path.isfile(root):
                files = [root]
            else:  # os.walk, not Path.rglob: a third of the time
                files = []
                for folder, subfolders, names in os.walk(root):
                    subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
                    files += [os.path.join(folder, n) for n in sorted(names) if n.endswith((".py", ".json"))]
            for path in files:
                with open(path, "rb") as handle:
                    h.update(os.path.relpath(path, _PACKAGE).encode() + b"\0" + handle.read() + b"\0")
        _digest = h.digest()
    return _digest


def entry_key(text: str, filename: str) -> str:
    """The key of the rule set ``text`` loads into under ``filename``."""
    h = hashlib.sha256(FORMAT)
    for part in (sys.version, sys.implementation.cache_tag or "", filename):
        h.update(part.encode("utf-8", "surrogatepass") + b"\0")
    h.update(source_digest())
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def load_or_parse(text: str, filename: str, parse: Callable[[str, str], RuleSet]) -> RuleSet:
    """The rule set of ``text`` from the cache, else ``parse(text, filename)`` (stored for the next process)."""
    folder = cache_dir()
    if folder is None:
        return parse(text, filename)
    try:
        path = folder / f"rules-{entry_key(text, filename)}.pickle"
    except OSError:  # attngate's own source unreadable: parse, cache nothing
        return parse(text, filename)
    cached = _read(path)
    if cached is not None and cached.filename == filename:
        try:  # pruning removes the entries least recently used, not the oldest written
            os.utime(path)
        except OSError:
            pass
        return cached
    rule_set = parse(text, filename)  # raises RulesError before anything is stored
    _write(path, rule_set)
    return rule_set


def _read(path: Path) -> RuleSet | None:
    try:  # without blocking: a FIFO put in its place is refused, never waited on
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as handle:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
                return None
            # another user's file, or one others may write (a shared XDG_CACHE_HOME), is never unpickled
            if os.name == "posix" and (st.st_uid != os.getuid() or st.st_mode & 0o022):
                return None
            data = handle.read(MAX_BYTES + 1)
    except (OSError, ValueError):
        return None
    head = len(FORMAT) + 32
    if (
        len(data) < head
        or not data.startswith(FORMAT)
        or hashlib.sha256(data[head:]).digest() != data[len(FORMAT) : head]
    ):
        return None
    try:
        codes, pickled = marshal.loads(data[head:])
        unpickler = _Unpickler(io.BytesIO(pickled))
        unpickler.codes = codes
        loaded = unpickler.load()
    except Exception:  # noqa: BLE001 - whatever a damaged entry raises, it is parsed again
        return None
    return loaded if isinstance(loaded, RuleSet) else None


def _write(path: Path, rule_set: RuleSet) -> None:
    try:
        buffer = io.BytesIO()
        pickler = _Pickler(buffer)
        pickler.dump(rule_set)
        payload = marshal.dumps((tuple(pickler.codes), buffer.getvalue()))
    except Exception:  # noqa: BLE001 - a rule set that does not pickle is simply not cached
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".rules-", suffix=".tmp")
        try:
            with open(fd, "wb") as handle:
                handle.write(FORMAT + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, path)  # atomic: a reader sees the whole entry or none
        except BaseException:
            os.unlink(tmp)
            raise
        _prune(path.parent)
    except OSError:  # a read-only home, a full disk: the next process parses again
        pass


def _prune(folder: Path) -> None:
    entries = []
    for entry in folder.glob("rules-*.pickle"):
        try:
            entries.append((entry.stat().st_mtime, entry))
        except OSError:
            pass
    for _, entry in sorted(entries, reverse=True)[MAX_ENTRIES:]:
        try:
            entry.unlink()
        except OSError:
            pass


#: stored by their fields, rebuilt by their constructors (pickle's state protocol for frozen slotted dataclasses
#: costs more: a fields() call and a setattr per field of each of ~600 objects)
_BY_FIELDS: tuple[type, ...] = (RuleSet, Predicate, Invariant, Deviation, FactValue)
#: the names of a Rule's fields, stored once an entry (pickle memoizes the tuple): a Rule is built by keyword only
_RULE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Rule))


def restored_rule(names: tuple[str, ...], values: tuple[Any, ...]) -> Rule:
    """A Rule from its fields' names and values, as an entry stores it."""
    return Rule(**dict(zip(names, values)))


_GLOBALS = {(c.__module__, c.__qualname__): c for c in (*_BY_FIELDS, restored_condition, restored_rule)}


class _Pickler(pickle.Pickler):
    """A rule set as constructor calls; code objects (which pickle does not take) by their index in ``codes``."""

    def __init__(self, file: Any):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.codes: list[types.CodeType] = []

    def persistent_id(self, obj: Any) -> int | None:
        if type(obj) is types.CodeType:
            self.codes.append(obj)
            return len(self.codes) - 1
        return None

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is Condition:  # no syntax trees; each conjunct with its code (explanations evaluate them)
            conjuncts = tuple((c.text, c.compiled()) for c in obj.conjuncts)
            return restored_condition, (obj.text, obj.code, conjuncts, obj.reads)
        if type(obj) in _BY_FIELDS:
            return type(obj), tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))
        if type(obj) is Rule:
            return restored_rule, (_RULE_FIELDS, tuple(getattr(obj, name) for name in _RULE_FIELDS))
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    """Only what a rule set is made of: the classes and the function above, and the entry's code objects."""

    codes: tuple[Any, ...] = ()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _GLOBALS[module, name]
        except KeyError:
            raise pickle.UnpicklingError(f"{module}.{name} is no part of a rule set") from None

    def persistent_load(self, pid: Any) -> Any:
        code = self.codes[pid]
        if type(code) is not types.CodeType:
            raise pickle.UnpicklingError("no code object")
        return code
