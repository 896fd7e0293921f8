"""The SGLang launch lines of docs/cli.md (its ``<!-- launch lines -->`` block); no imports beyond the standard
library, so that the sglang venv's tests read them too."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"<!-- launch lines: .*? -->\n```bash\n(.*?)```", re.S)


def launch_lines() -> list[str]:
    return _BLOCK.search((ROOT / "docs" / "cli.md").read_text()).group(1).splitlines()
