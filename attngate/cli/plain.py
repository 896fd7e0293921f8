"""Plain text lines on stdout, wrapped at the console width, as ``attngate explain``'s default screen prints them.

rich prints a line of printable ASCII no wider than its console as the line and a newline (no markup, no styles,
no ANSI codes, in a pipe or on a terminal); importing rich's console costs a cold ``explain`` about 15 ms (issue 53
item 9). So where the width rich would lay out in is read here exactly as rich's ``Console`` reads it, and every
wrapped line is such a line, the lines are written without rich; anything else (non-ASCII text, whose cell widths
rich measures; Windows; Jupyter; a dumb terminal, which rich gives 80 columns) goes through rich as before.
tests/cli/test_plain_lines.py holds the two paths to the same bytes.
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import Any

from attngate.errors import visible
from attngate.util.text import bounded_width


def wrap_lines(lines: list[str], width: int) -> list[str]:
    """Each line wrapped at ``width`` columns, never cut; continuation lines start two columns right of the line's own
    text, so that a wrapped entry reads as one. Words break at spaces only (rule ids and gate names stay whole)."""
    out = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip(" ")))
        # textwrap keeps a paragraph's leading spaces on its first line
        out += textwrap.wrap(line, width=max(width, 20), subsequent_indent=indent + "  ", break_on_hyphens=False) or [
            ""
        ]
    return out


def as_written(text: str) -> str:
    """``text`` made visible (attngate.errors.visible: controls and bidi characters as escapes) and, where standard
    output's encoding cannot hold a character (PYTHONIOENCODING=ascii, a latin-1 locale), that character as the
    backslash escape the stream writes in its place (attngate.cli's streams), so that lines are laid out at the width
    they are written in."""
    text = visible(text)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # an encoding Python does not know: the stream's own errors handling decides
        pass
    return text


def print_lines(lines: list[str]) -> None:
    """Plain text wrapped at the console width (never cut, see wrap_lines); no markup, no ANSI codes in a pipe, an
    input's controls and bidi characters made visible, what the output's encoding cannot hold escaped."""
    shown = [as_written(line) for line in lines]
    width = console_width()
    if width is not None:
        wrapped = wrap_lines(shown, width)
        if all(len(line) <= width and line.isascii() and line.isprintable() for line in wrapped):
            for line in wrapped:  # one write and one flush a line, as rich's Console.print does
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            return
    print_rich_lines(shown)


def print_rich_lines(lines: list[str]) -> None:
    """``lines`` (made visible already) wrapped at the console width and printed by rich (imported here, where
    print_lines cannot print them without it), laid out as attngate.cli.render's console lays them out."""
    from rich.text import Text

    console = rich_console()
    for line in wrap_lines(lines, console.width):
        console.print(Text(line), overflow="fold", crop=False)


def rich_console() -> Any:
    """A rich Console whose width is bounded (COLUMNS=0, 1 or 10**5 still give readable lines); made per call, so
    that COLUMNS and the output stream are read when rendering. rich is imported here, not with this module."""
    from rich.console import Console

    console = Console()
    console.width = bounded_width(console.width)
    return console


def console_width() -> int | None:
    """The width attngate's rich console lays out in (``render._console``: rich's ``Console().width``, bounded by
    attngate.util.text), read as rich 13-15 read it; None where rich reads more than this does."""
    import builtins

    if sys.platform == "win32" or hasattr(builtins, "get_ipython"):  # legacy consoles, Jupyter: rich's own sizes
        return None
    if sys.stdout is None or hasattr(sys.stdout, "rich_proxied_file"):  # no stdout, or rich's proxy of one
        return None
    if os.environ.get("TERM", "").lower() in ("dumb", "unknown"):  # on a terminal rich gives it 80 columns
        return None
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return bounded_width(int(columns))
    width = None
    for stream, default in ((sys.__stdin__, 0), (sys.__stdout__, 1), (sys.__stderr__, 2)):
        try:
            fd = stream.fileno()  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - rich's own fallback to the standard descriptor
            fd = default
        try:
            width = os.get_terminal_size(fd).columns
        except (AttributeError, ValueError, OSError):  # not a terminal
            continue
        break
    return bounded_width(width or 80)
