"""The default ``attngate explain`` screen on every example model, GPU arch and a spread of flag sets: one screen (at
most 60 lines of at most 80 columns), wrapped lines indented under their text, no fact copies among the decisions."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from attngate.cli import app
from tests.support.helpers import MODELS

FLAG_SETS = {
    "defaults": [],
    "deterministic": ["--enable-deterministic-inference"],
    "dp-attention": ["--tp-size", "2", "--enable-dp-attention", "--dp-size", "2"],
    "eagle": [
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ],
    "fp8-kv": ["--kv-cache-dtype", "fp8_e4m3"],
    "flashinfer-page-16": ["--attention-backend", "flashinfer", "--page-size", "16"],
    "split-backends": ["--prefill-attention-backend", "fa3", "--decode-attention-backend", "flashinfer"],
}
CONFIGS = sorted(MODELS.glob("*.json"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_screen_fits_80_columns_by_60_lines(config):
    runner = CliRunner(env={"COLUMNS": "80"})
    for gpu in ("sm80", "sm90", "sm100"):
        for name, flags in FLAG_SETS.items():
            res = runner.invoke(app, ["explain", "--model", str(config), "--gpu", gpu, *flags])
            where = f"{config.stem} {gpu} {name}"
            assert res.exit_code in (0, 1), f"{where}: {res.output}"
            lines = res.output.splitlines()
            assert len(lines) <= 60 and max(map(len, lines)) <= 80, f"{where}: {len(lines)} lines\n{res.output}"
            if res.exit_code:
                continue
            assert not any(" <- fact:" in line for line in lines), where  # facts copied into gates are counted only


def test_wrapped_lines_continue_two_columns_right_of_their_text():
    from attngate.cli.plain import wrap_lines

    gate = "  flashinfer.use_ragged_prefill = False <- flashinfer.deterministic-no-ragged + flashinfer.no-ragged-multimodal"
    out = wrap_lines(["headline " * 12, gate, ""], 40)
    assert out[0].startswith("headline") and all(line.startswith("  headline") for line in out[1:3])
    first = next(i for i, line in enumerate(out) if "use_ragged_prefill" in line)
    assert out[first].startswith("  flashinfer") and out[first + 1].startswith("    ") and out[-1] == ""
    assert "flashinfer.deterministic-no-ragged" in " ".join(out)  # ids break at spaces only, never at hyphens
    assert all(len(line) <= 40 for line in out)
