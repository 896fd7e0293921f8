"""rules.yaml "known failures": refused, naming the entry, unless the caller opts in (--allow-known-failure ID)."""

from __future__ import annotations

import pytest

from attngate import PlanError, Platform, ServerArgs, resolve
from tests.support.helpers import model


@pytest.mark.parametrize(
    "flags, name, entry",
    [
        ("--attention-backend fa3 --speculative-algorithm EAGLE", "Llama-3.1-8B", "known.fa-eagle-tree-verify-drift"),
        (
            "--attention-backend flashinfer --speculative-algorithm NGRAM",
            "DeepSeek-V2-Lite",
            "known.flashinfer-mla-non-eagle-verify",
        ),
        (
            "--attention-backend flashinfer --speculative-algorithm NGRAM",
            "Mistral-7B-v0.1",
            "known.flashinfer-swa-non-eagle-verify",
        ),
    ],
)
def test_a_known_failure_is_refused_naming_its_entry_unless_allowed(flags, name, entry):
    args = ServerArgs.from_flags(flags.split())
    with pytest.raises(PlanError) as err:
        resolve(args, model(name), Platform.from_name("sm90"))
    (v,) = [v for v in err.value.violations if v.kind == "known_failure"]
    assert v.rule == entry and v.issue.startswith("https://github.com/sgl-project/sglang/")
    r = resolve(args, model(name), Platform.from_name("sm90"), allow_known_failures=[entry])
    assert any(w.startswith(f"known failure {entry} allowed") for w in r.warnings)
    with pytest.raises(PlanError, match="did you mean"):
        resolve(args, model(name), Platform.from_name("sm90"), allow_known_failures=[entry + "x"])
