"""Load YAML safely into plain Python while remembering where every value came from.

PyYAML's safe loader composes the node tree (no tags beyond the safe set, no object construction);
this module walks it, rejects duplicate keys, and records each value's ``line:col`` by path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from attngate.errors import Problem, clip
from attngate.util.inputs import nesting_depth

Path = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Mark:
    line: int  # 1-based
    col: int  # 1-based
    plain: bool  # a single-line plain or quoted scalar: columns inside it map 1:1 to the file
    quoted: bool


@dataclass
class YamlDocument:
    data: Any
    marks: dict[Path, Mark]
    filename: str

    def where(self, path: Path, offset: int | None = None) -> str:
        """``file:line:col`` of the value at ``path`` (or its nearest located ancestor)."""
        while path not in self.marks and path:
            path = path[:-1]
        mark = self.marks.get(path, Mark(1, 1, False, False))
        col = mark.col
        if offset is not None and mark.plain:
            col += offset + (1 if mark.quoted else 0)
        elif offset is not None:
            return f"{self.filename}:{mark.line}:{col} (column {offset + 1} of the expression)"
        return f"{self.filename}:{mark.line}:{col}"


#: values after alias expansion beyond one per character of the text: bounds alias bombs ("billion laughs"), whose
#: expansion outgrows their text, while a document without aliases (it holds fewer values than characters) never hits it
MAX_VALUES = 100_000
MAX_DEPTH = 64  # nesting, counted after alias expansion: bounds self-referencing anchors too
#: an integer scalar's size: YAML reads hex, binary and base-60 integers of any length, and one past Python's limit on
#: decimal digits (4300) could not even be quoted in a message
MAX_INT_BITS = 4096


class _TooLarge(Exception):
    pass


def load_yaml(text: str, filename: str) -> tuple[YamlDocument | None, list[Problem]]:
    """Parse ``text``; returns the document (None when it does not parse) and every problem found.

    Bounded: more than MAX_VALUES + len(text) values or MAX_DEPTH levels after alias expansion is a problem,
    not a hang or a RecursionError."""
    problems: list[Problem] = []
    loader = None
    if nesting_depth(text) > MAX_DEPTH:
        return None, [Problem(filename, f"nested more than {MAX_DEPTH} levels deep", code="input.too-deep")]
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
    except RecursionError:
        return None, [Problem(filename, f"nested more than {MAX_DEPTH} levels deep", code="input.too-deep")]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        reason = getattr(exc, "problem", None) or str(exc)
        return None, [Problem(where, f"YAML syntax error: {reason}", code="input.yaml-syntax")]
    finally:
        if loader is not None:
            loader.dispose()
    doc = YamlDocument(None, {}, filename)
    if node is None:
        return doc, problems
    try:
        doc.data = _walk(node, (), doc, loader, problems, [-len(text)])  # counts up to MAX_VALUES past the text
    except _TooLarge as exc:
        return None, [Problem(doc.where(exc.args[0]), exc.args[1], code="input.too-large")]
    return doc, problems


# libyaml's parser when PyYAML was built with it (5-10x faster); same safe constructor either way
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_STANDARD_TAGS = {yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"}


def _walk(
    node: yaml.Node, path: Path, doc: YamlDocument, loader: Any, problems: list[Problem], count: list[int]
) -> Any:
    count[0] += 1
    if count[0] > MAX_VALUES:
        raise _TooLarge(path, f"more than {MAX_VALUES} values after alias expansion beyond the text's own size")
    if len(path) > MAX_DEPTH:
        raise _TooLarge(path, f"nested more than {MAX_DEPTH} levels deep (after alias expansion; a recursive anchor?)")
    start = node.start_mark
    single_line = node.end_mark.line == start.line
    style = getattr(node, "style", None)
    doc.marks[path] = Mark(
        start.line + 1, start.column + 1, single_line and style in (None, "", "'", '"'), style in ("'", '"')
    )
    expected = _STANDARD_TAGS.get(type(node))
    if expected is not None and node.tag != expected:
        problems.append(Problem(doc.where(path), f"unsupported YAML tag {node.tag!r}", code="input.yaml-tag"))
        return None
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _walk(key_node, path + ("<key>",), doc, loader, problems, count)
            if isinstance(key, (list, dict)):
                problems.append(
                    Problem(doc.where(path + ("<key>",)), "a mapping key must be a scalar", code="input.yaml-key")
                )
                continue
            if key in out:
                mark = key_node.start_mark
                problems.append(
                    Problem(
                        f"{doc.filename}:{mark.line + 1}:{mark.column + 1}",
                        f"duplicate key {key!r}",
                        code="input.duplicate-key",
                    )
                )
                continue
            out[key] = _walk(value_node, path + (key,), doc, loader, problems, count)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, path + (i,), doc, loader, problems, count) for i, item in enumerate(node.value)]
    try:
        value = loader.construct_object(node, deep=True)
    except Exception as exc:  # noqa: BLE001 - PyYAML's constructors raise more than YAMLError (``!!timestamp nope``)
        problems.append(
            Problem(
                doc.where(path),
                f"bad scalar {clip(node.value)!r} ({node.tag}): {getattr(exc, 'problem', None) or exc}",
                code="input.yaml-scalar",
            )
        )
        return None
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        problems.append(
            Problem(
                doc.where(path),
                f"an integer of {value.bit_length()} bits, past any value attngate reads",
                code="input.too-large",
            )
        )
        return None
    return value
