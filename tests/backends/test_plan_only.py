"""Backends take every decision from the Plan: they never see a server argument."""

from __future__ import annotations

import ast

import pytest

from attngate import ForwardMode, ModelFacts, Platform, ServerArgs, resolve
from helpers import MODELS, ROOT

BACKENDS = ROOT / "attngate" / "backends"


def test_no_backend_module_touches_server_arguments():
    for path in BACKENDS.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
                assert not any("server_args" in n or n == "ServerArgs" for n in names), f"{path.name} imports server args"
            if isinstance(node, ast.Name):
                assert node.id not in ("server_args", "ServerArgs"), f"{path.name}:{node.lineno}"


def _rule_reads() -> set[str]:
    from attngate.rules.load import load_rules

    rules = load_rules()
    reads = {n for r in rules.rules for n in r.condition.reads}
    return reads | {n for p in rules.predicates for n in p.condition.reads}


def test_arguments_no_rule_reads_cannot_change_what_a_backend_sees():
    torch = pytest.importorskip("torch")
    from attngate.backends.reference import ReferenceBackend
    from tests.backends.test_reference_scenarios import H, D, setup

    unread = set(ServerArgs.model_fields) - _rule_reads()
    assert {"context_length", "speculative_draft_model_path", "tp_size"} <= unread
    facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
    base = ServerArgs(attention_backend="fa3")
    varied = base.model_copy(update={"context_length": 777, "speculative_draft_model_path": "/elsewhere", "tp_size": 8, "dtype": "float16"})
    plans = [resolve(a, facts, Platform.from_name("sm90")).plan for a in (base, varied)]
    assert plans[0] == plans[1] and plans[0].fingerprint == plans[1].fingerprint
    outs = []
    for plan in plans:
        s, _, backend, full_k, full_v, gen = setup([(7, 5), (0, 9)], ForwardMode.EXTEND, 16, plan=plan)
        assert isinstance(backend, ReferenceBackend) and not hasattr(backend, "server_args")
        q = torch.randn(s.batch.num_tokens, H, D, generator=gen)
        backend.init_forward_metadata(s.batch)
        outs.append(backend.forward(q, torch.cat([full_k[0][7:], full_k[1]]), torch.cat([full_v[0][7:], full_v[1]]), backend.layers[0], s.batch))
    assert torch.equal(*outs)
