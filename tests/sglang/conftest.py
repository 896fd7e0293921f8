import pytest

pytest.importorskip("sglang.srt.server_args", reason="the sglang extra is not installed (.ci/run gives it its own venv)")
