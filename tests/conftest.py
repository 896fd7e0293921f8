from __future__ import annotations

import os

import pytest

# the suite never reaches the network: hub ids resolve from a test cache (tests/facts/test_launch_line.py)
os.environ["HF_HUB_OFFLINE"] = "1"

from attngate import load_rules


@pytest.fixture(scope="session")
def rules():
    return load_rules()
