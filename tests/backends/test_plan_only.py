"""Backends take every decision from the Plan: they never see a server argument."""

from __future__ import annotations

import ast

import pytest

from attngate import ForwardMode, ModelFacts, Platform, ServerArgs, resolve
from tests.support.helpers import MODELS, ROOT

BACKENDS = ROOT / "attngate" / "backends"


def test_no_backend_module_touches_server_arguments():
    for path in BACKENDS.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
                assert not any("server_args" in n or n == "ServerArgs" for n in names), (
                    f"{path.name} imports server args"
                )
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
    from tests.backends.test_reference_scenarios import D, H, setup

    unread = set(ServerArgs.model_fields) - _rule_reads()
    assert {"context_length", "speculative_draft_model_path"} <= unread  # tp_size is read: it splits the heads
    facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
    base = ServerArgs(attention_backend="fa3")
    varied = base.model_copy(
        update={"context_length": 777, "speculative_draft_model_path": "/elsewhere", "dtype": "float16"}
    )
    plans = [resolve(a, facts, Platform.from_name("sm90")).plan for a in (base, varied)]
    assert plans[0] == plans[1] and plans[0].fingerprint == plans[1].fingerprint
    outs = []
    for plan in plans:
        s, _, backend, full_k, full_v, gen = setup([(7, 5), (0, 9)], ForwardMode.EXTEND, 16, plan=plan)
        assert isinstance(backend, ReferenceBackend) and not hasattr(backend, "server_args")
        q = torch.randn(s.batch.num_tokens, H, D, generator=gen)
        backend.init_forward_metadata(s.batch)
        outs.append(
            backend.forward(
                q,
                torch.cat([full_k[0][7:], full_k[1]]),
                torch.cat([full_v[0][7:], full_v[1]]),
                backend.layers[0],
                s.batch,
            )
        )
    assert torch.equal(*outs)


@pytest.mark.parametrize(
    "args, per_rank",
    [
        ({}, (1, 32, 8)),
        ({"tp_size": 8}, (8, 4, 1)),
        ({"tp_size": 16}, (16, 2, 1)),  # 8 KV heads over 16 ranks: each KV head replicated on two
        ({"tp_size": 8, "dp_size": 4, "enable_dp_attention": True}, (2, 16, 4)),  # DP attention: attention TP is 8 / 4
    ],
)
def test_the_plan_carries_each_ranks_heads(args, per_rank):
    plan = resolve(
        ServerArgs(attention_backend="fa3", **args),
        ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json"),
        Platform.from_name("sm90", runs_sglang=False),  # attngate's backends: SGLang's FA over DP padding is refused
    ).plan
    assert (plan.common.attn_tp_size, plan.common.num_q_heads_per_rank, plan.common.num_kv_heads_per_rank) == per_rank


def test_heads_that_do_not_split_evenly_are_refused():
    from attngate import PlanError

    with pytest.raises(PlanError, match="attn-tp.heads-split-evenly"):
        resolve(
            ServerArgs(attention_backend="fa3", tp_size=3),
            ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json"),
            Platform.from_name("sm90"),
        )


def test_backends_take_each_ranks_heads_from_the_plan():
    torch = pytest.importorskip("torch")
    from attngate.backends.reference import ReferenceBackend
    from attngate.backends.runtime.kv_cache import MHATokenToKVPool
    from attngate.backends.runtime.layer import layers_from_model
    from attngate.errors import BatchMetadataError

    facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
    plan = resolve(ServerArgs(attention_backend="fa3", tp_size=4), facts, Platform.from_name("sm90")).plan
    rtt = torch.zeros(1, 64, dtype=torch.int32)
    per_rank = layers_from_model(facts, plan)
    assert (per_rank[0].num_q_heads, per_rank[0].num_kv_heads) == (8, 2)
    ReferenceBackend(plan, MHATokenToKVPool(64, 1, len(per_rank), 2, 128), rtt, per_rank)
    with pytest.raises(BatchMetadataError, match="attention TP 4 gives each rank of its full layers 8/2"):
        ReferenceBackend(plan, MHATokenToKVPool(64, 1, 32, 8, 128), rtt, layers_from_model(facts))


@pytest.mark.parametrize("tp, full, sliding", [(1, (64, 4), (64, 8)), (4, (16, 1), (16, 2)), (8, (8, 1), (8, 1))])
def test_each_layer_kind_takes_its_own_shape_and_heads_per_rank(tp, full, sliding):
    """MiMo-V2-Flash: the sliding-window layers' 64/8 heads (swa_* keys) beside the full layers' 64/4, split over
    attention TP per kind as SGLang's get_num_kv_heads / get_swa_num_kv_heads split them (replicated below one a
    rank); the KV pool holds each layer's own rows, and a layer given the other kind's heads is refused."""
    torch = pytest.importorskip("torch")
    import dataclasses

    from attngate.backends.reference import ReferenceBackend
    from attngate.backends.runtime.kv_cache import kv_pool_for
    from attngate.backends.runtime.layer import layers_from_model
    from attngate.errors import BatchMetadataError
    from attngate.facts.modes import LayerKind

    facts = ModelFacts.from_hf_config(MODELS / "MiMo-V2-Flash.json")
    plan = resolve(ServerArgs(attention_backend="fa3", tp_size=tp), facts, Platform.from_name("sm90")).plan
    layers = layers_from_model(facts, plan)
    want = {LayerKind.FULL: full, LayerKind.SLIDING_WINDOW: sliding}
    assert {(lay.kind, lay.num_q_heads, lay.num_kv_heads, lay.head_dim, lay.v_head_dim) for lay in layers} == {
        (kind, *heads, 192, 128) for kind, heads in want.items()
    }
    pool = kv_pool_for(facts, 64, 1, len(layers), torch.float32, "cpu")
    assert [tuple(pool.k_buffer[i].shape[1:]) for i in (0, 1)] == [(4, 192), (8, 192)]
    assert [tuple(pool.v_buffer[i].shape[1:]) for i in (0, 1)] == [(4, 128), (8, 128)]
    if tp > 1 and full != sliding:
        swapped = [dataclasses.replace(lay, num_kv_heads=full[1]) for lay in layers]
        with pytest.raises(BatchMetadataError, match="of its sliding_window layers"):
            ReferenceBackend(plan, pool, torch.zeros(1, 64, dtype=torch.int32), swapped)
