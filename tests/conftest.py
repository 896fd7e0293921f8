from __future__ import annotations

import pytest

from attngate import load_rules


@pytest.fixture(scope="session")
def rules():
    return load_rules()
