"""Load a rules file into a :class:`RuleSet` (type-checked by :mod:`attngate.rules.check`); every problem is
reported with ``file:line:col``."""

from __future__ import annotations

import functools
import threading
from importlib import resources
from pathlib import Path

from attngate.errors import Problem, RulesError, check_arguments
from attngate.rules.cache import load_or_parse
from attngate.rules.deviations import Deviation, check_deviations
from attngate.rules.invariants import Invariant, check_invariants
from attngate.rules.ruleset import Predicate, Rule, RuleSet
from attngate.types import FactType
from attngate.util.inputs import read_text
from attngate.util.suggest import suggestion


def shipped_rules_path() -> Path:
    """``rules.yaml`` inside the installed package, else at the root of a source checkout."""
    # the attngate package's folder, as resources.files("attngate") names it (not resolved: the same path string under a
    # symlinked install); read off this module, since importing the package would import the engine
    package = Path(__file__).parent.parent
    if package.is_dir():  # on disk, resources.files("attngate") is this folder: no resource reader to import
        packaged = package / "rules.yaml"
        if packaged.is_file():
            return packaged
    else:  # a zip import, say
        resource = resources.files("attngate") / "rules.yaml"
        if resource.is_file():
            return Path(str(resource))
    return Path(__file__).resolve().parents[2] / "rules.yaml"


_LOADING = threading.Lock()


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, text: str) -> RuleSet:
    """The rules of ``text``, read from ``path``: keyed on the content, so a file rewritten within one mtime tick (or
    with its mtime put back) is parsed again, and the same text under another name is parsed under that name. A new
    process finds it in the disk cache (attngate.rules.cache), keyed the same way."""
    return load_or_parse(text, path, parse_rules)


def load_rules(path: str | Path | None = None) -> RuleSet:
    """Load a rules file (default: the shipped ``rules.yaml``). Raises RulesError listing every problem (UsageError
    for a path that is no path)."""
    check_arguments(("path", path, (str, Path, type(None)), "rules text goes to parse_rules"))
    path = Path(path) if path is not None else shipped_rules_path()
    text = read_text(path, RulesError, "rules file")  # bounded, never waits on a FIFO; a few ms for the shipped file
    with _LOADING:  # threads resolving at a cold start wait for one parse instead of each parsing the file
        return _load_cached(str(path), text)


def parse_rules(text: str, filename: str = "rules.yaml") -> RuleSet:
    """Parse and type-check rules from text. Raises RulesError listing every problem (UsageError for arguments that
    are no strings)."""
    check_arguments(
        ("text", text, str, "the rules file's text; a path goes to load_rules"),
        ("filename", filename, str, "the name problems are reported under"),
    )
    # imported here: a process that finds its rules in the disk cache never needs the parser or the rules' schema
    from attngate.rules.check import check_document
    from attngate.util.yaml_source import load_yaml

    doc, problems = load_yaml(text, filename)
    rules: list[Rule] = []
    predicates: list[Predicate] = []
    invariants: list[Invariant] = []
    deviations: list[Deviation] = []
    if doc is not None:
        rules, predicates = check_document(doc, problems)
        if isinstance(doc.data, dict):
            predicate_types = {p.name: FactType("bool") for p in predicates}
            invariants = check_invariants(doc.data.get("invariants"), doc, problems, predicate_types)
            deviations = check_deviations(doc.data.get("deviations"), doc, problems, predicate_types)
            known = {r.id for r in rules}
            problems += [
                Problem(
                    d.where,
                    f"deviation {d.id!r}: no rule {rule!r}",
                    help=suggestion(rule, known),
                    code="rules.deviation-rule",
                )
                for d in deviations
                for rule in d.rules
                if rule not in known
            ]
    if problems:
        raise RulesError(problems)
    return RuleSet(tuple(rules), filename, tuple(predicates), tuple(invariants), tuple(deviations))
