"""attngate as a Hugging Face transformers attention implementation.

Importing this module registers ``"attngate"``. Outside a runtime, ``model(ids)`` and ``generate()``
run on transformers' own cache and mask with the plan's per-layer decisions
(attngate.integrations.transformers_plain, :func:`configure`). The paged, SGLang-style path:

``register()`` adds ``"attngate"`` to transformers' ``AttentionInterface``; a model built with
``attn_implementation="attngate"`` and bound to an :class:`AttngateRuntime` then runs every
attention call through an attngate backend over attngate's own paged KV cache (on CUDA the plan's
backends, FA and FlashInfer, each forward mode on the one the plan names; elsewhere the reference
backend), with a Plan resolved from the model's config::

    from attngate.integrations.transformers import AttngateRuntime, register
    register()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="attngate")
    rt = AttngateRuntime(model, page_size=16)
    req = rt.add_request()
    logits = rt.extend({req: prompt_ids[:10]})        # EXTEND, no prefix
    logits = rt.extend({req: prompt_ids[10:]})        # EXTEND over the cached prefix
    logits = rt.decode({req: next_id})                # DECODE through the paged cache

Like SGLang, the tokens of all requests of a forward are flattened into one sequence (batch dim 1)
with explicit ``position_ids``; transformers runs with ``use_cache=False`` and builds no mask, and
the backend takes every masking decision from the Plan and the layer specs.

MLA models (DeepSeek-V2/V3, Kimi-K2) keep only the latent in attngate's cache (``MLATokenToKVPool``:
ckv ++ kpe, ``kv_lora_rank + qk_rope_head_dim`` values per token). transformers hands the attention
function the decompressed K/V; the runtime takes the latent instead (ckv from a forward hook on
``kv_a_layernorm``, kpe from the roped key) and binds kv_b_proj as ``w_kc`` / ``w_vc``, so the
backend attends absorbed or non-absorbed as the plan's ``common.mla_form`` says.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

import torch

from attngate.backends.base import AttentionBackend
from attngate.backends.checks import kv_storage_dtype
from attngate.backends.plan_backend import PlanBackend
from attngate.backends.reference import ReferenceBackend
from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.kv_cache import PageAllocator, ReqToTokenPool, kv_pool_for
from attngate.backends.runtime.layer import AttentionLayer, layers_from_model
from attngate.engine.resolve import resolve
from attngate.errors import BatchMetadataError, Problem, UsageError, check_arguments
from attngate.facts.modes import ForwardMode
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.integrations.torch_platform import attngate_platform
from attngate.integrations.transformers_checks import (
    ATTN_IMPLEMENTATION,
    bind_layers,
    check_new_tokens,
    check_pool_fits_plan,
    check_runtime_arguments,
    check_softmax_attention_only,
    model_facts,
)
from attngate.integrations.transformers_plain import configure, plain_attention  # noqa: F401 - configure is public here
from attngate.plan.schema import Plan

_EXTEND_MODES = (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2)
_ACTIVE: contextvars.ContextVar["AttngateRuntime | None"] = contextvars.ContextVar("attngate_runtime", default=None)


def register() -> None:
    """Register ``"attngate"`` in transformers' AttentionInterface, with sdpa's mask builder (boolean, None when
    an unpadded causal batch needs none), so ``from_pretrained(..., attn_implementation="attngate")`` works.
    Idempotent; importing this module registers it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, attngate_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


def attngate_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query: [B, H, S, D]``, ``key``/``value: [B, H_kv, S_kv, D]``;
    returns ``([B, S, H, Dv], None)``. Inside an AttngateRuntime forward: the runtime's backend over its paged
    cache (B = 1, every request's tokens flattened); outside one: transformers' own cache and mask with the
    plan's decisions (attngate.integrations.transformers_plain)."""
    runtime = (
        None if torch.compiler.is_compiling() else _ACTIVE.get()
    )  # a runtime's forward never compiles (force_eager)
    if runtime is None:  # model(ids) / generate(): transformers' own cache and mask, the plan's decisions
        return plain_attention(module, query, key, value, attention_mask, scaling, **kwargs)
    layer = runtime.layer_for(module, scaling)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    if layer.is_mla:  # the latent, not the decompressed K/V: ckv (hooked) ++ kpe (the roped part of every head's key)
        ckv = runtime.take_ckv(layer.layer_id)
        k, v = torch.cat([ckv.to(k.dtype), k[:, 0, layer.qk_nope_head_dim :]], dim=-1)[:, None, :], None
    out = runtime.backend.forward(q, k, v, layer, runtime.batch)
    return out.unsqueeze(0), None


@dataclass
class _Request:
    row: int
    seq_len: int = 0
    pages: list[int] = field(default_factory=list)


class AttngateRuntime:
    """Binds a transformers model to an attngate backend, KV pool and request table.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers model built with ``attn_implementation="attngate"``.
    server_args : ServerArgs, optional
        Resolved with the model's facts into the Plan (default: SGLang's defaults).
    platform : Platform, optional
        The plan's GPU; default: detected when CUDA is present, else sm90 (the reference backend's semantics do not
        depend on it). A default backend that the rules refuse for this model falls back to the first candidate that
        runs it (attngate.engine.fallback).
    page_size, num_slots, max_requests, max_context_len : int
        KV pool geometry (tokens); page_size defaults to the plan's (``server_args.page_size`` as the rules resolve
        it) and must equal it, num_slots a multiple of it.
    backend_cls : type of AttentionBackend, optional
        The backend to run. Default: on CUDA the plan's own backends (:class:`PlanBackend`: each forward mode on the
        one ``plan.backend_for(mode)`` names, FA and FlashInfer), elsewhere the reference backend.

    Attributes
    ----------
    resolution, plan : Resolution, Plan
        The resolution of ``server_args`` with the model's ``facts`` (ModelFacts), and its plan.
    layers : list of AttentionLayer
        One layer spec per entry of ``facts.layer_kinds``, bound to its module (scaling, sinks, MLA weights).
    pool, allocator, req_to_token_pool
        The KV pool (``num_slots`` token slots of the plan's KV dtype), its page allocator (``page_size`` tokens a
        page) and the request table (``[max_requests, max_context_len]`` int32).
    backend : AttentionBackend
        The backend every forward runs on.

    Raises
    ------
    UsageError
        Listing every bad argument (a model not built for attngate, a geometry that does not fit, a page_size other
        than the server arguments'), before anything is allocated.
    BackendRefusal
        Where the backend refuses the plan or the model's layers (on CUDA, a plan naming a backend attngate has no
        kernels for, say triton: resolve with another --attention-backend, or pass ``backend_cls=ReferenceBackend``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        server_args: ServerArgs | None = None,
        platform: Platform | None = None,
        page_size: int | None = None,
        num_slots: int = 4096,
        max_requests: int = 16,
        max_context_len: int = 2048,
        backend_cls: type[AttentionBackend] | None = None,
    ):
        register()
        check_arguments(
            ("platform", platform, (Platform, type(None)), "e.g. Platform.from_name('sm90')"),
            ("backend_cls", backend_cls, (type, type(None)), "a backend class, e.g. ReferenceBackend"),
        )
        self.model = model
        page_size = check_runtime_arguments(model, server_args, page_size, num_slots, max_requests, max_context_len)
        config = model.config
        self.facts = model_facts(config, type(model).__name__)
        check_softmax_attention_only(model, self.facts)
        if platform is None:
            platform = attngate_platform()
        args = server_args or ServerArgs(page_size=page_size)
        self.resolution = resolve(args, self.facts, platform)
        self.plan: Plan = self.resolution.plan
        page_size = check_pool_fits_plan(self.plan, page_size, num_slots)
        device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.layers: list[AttentionLayer] = layers_from_model(self.facts)
        self._ckv: dict[int, torch.Tensor] = {}
        bind_layers(
            model, self.layers, self._ckv_hook
        )  # before the backend is built: backends copy scaling, sinks and MLA weights
        self.page_size = page_size
        kv_dtype = kv_storage_dtype(self.plan, dtype)  # --kv-cache-dtype fp8_e4m3: an FP8 pool
        self.pool = kv_pool_for(self.facts, num_slots, page_size, len(self.layers), kv_dtype, device)
        self.allocator = PageAllocator(num_slots // page_size, page_size, _scattered(num_slots // page_size))
        self.req_to_token_pool = ReqToTokenPool(max_requests, max_context_len, device)
        if backend_cls is None:
            backend_cls = PlanBackend if torch.device(device).type == "cuda" else ReferenceBackend
        self.backend = backend_cls(  # every backend takes q_dtype (attngate.backends.factories); FlashInfer reads it
            self.plan, self.pool, self.req_to_token_pool.req_to_token, self.layers, device, q_dtype=dtype
        )
        self.batch: ForwardBatch | None = None
        self._requests: dict[int, _Request] = {}
        self.device = device

    # ---- requests ----------------------------------------------------------------------------------

    def add_request(self) -> int:
        row = self.req_to_token_pool.alloc()
        self._requests[row] = _Request(row)
        return row

    def free_request(self, req: int) -> None:
        if req not in self._requests:
            raise BatchMetadataError(
                Problem(
                    f"request {req}",
                    "unknown request (freed already, or never added)",
                    code="batch-metadata.unknown-request",
                )
            )
        r = self._requests.pop(req)
        self.allocator.free(r.pages)
        self.req_to_token_pool.free(r.row)

    # ---- forward passes ------------------------------------------------------------------------------

    def extend(self, new_tokens: dict[int, torch.Tensor], mode: ForwardMode | str = ForwardMode.EXTEND) -> torch.Tensor:
        """Run the new tokens of each request (``{req: ids [n]}``, int64, or a list of ints) as one forward of ``mode``
        (EXTEND, TARGET_VERIFY or DRAFT_EXTEND_V2); returns ``[num_tokens, vocab]`` logits (hidden states for a
        model without a head). Raises BatchMetadataError naming every bad request, nothing applied."""
        if mode not in [m.value for m in _EXTEND_MODES]:  # a list: mode may be anything, hashable or not
            raise UsageError(
                Problem(
                    "mode",
                    f"extend runs {', '.join(m.value for m in _EXTEND_MODES)}, not {mode!r}; "
                    "one token per request: decode()",
                    code="usage.extend-mode",
                )
            )
        return self._forward(ForwardMode(mode), new_tokens)

    def decode(self, next_tokens: dict[int, int | torch.Tensor]) -> torch.Tensor:
        """One token per request (``{req: id}``) as a DECODE forward; returns ``[batch_size, vocab]`` logits."""
        return self._forward(ForwardMode.DECODE, next_tokens)

    def _as_ids(self, new_tokens: dict[int, object]) -> dict[int, torch.Tensor]:
        """Each request's ids as a 1-D integer tensor; BatchMetadataError naming every value that is not one."""
        if not isinstance(new_tokens, dict):
            raise UsageError(
                Problem(
                    "new_tokens",
                    f"takes a dict {{request: token ids}}, not {type(new_tokens).__name__}",
                    code="usage.new-tokens",
                )
            )
        if not new_tokens:
            raise UsageError(
                Problem("new_tokens", "names no request; a forward runs one request or more", code="usage.new-tokens")
            )
        ids, problems = {}, []
        for req, value in new_tokens.items():
            try:
                t = torch.as_tensor(value)
            except (TypeError, ValueError, RuntimeError):
                t = None
            if t is not None and t.numel() == 0 and t.dim() == 1:  # [] is float32 to torch; "no new tokens" below
                t = t.long()
            if t is None or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool or t.dim() > 1:
                got = f"a {t.dim()}-D {t.dtype} tensor" if t is not None else type(value).__name__
                problems.append(
                    Problem(
                        f"request {req}",
                        f"token ids must be a 1-D integer tensor or a list of ints, not {got}",
                        code="usage.token-ids",
                    )
                )
            else:
                ids[req] = t.reshape(-1).to(torch.int64)  # the embedding takes int64 (or int32), not uint8
        if problems:
            raise BatchMetadataError(problems)
        return ids

    def _forward(self, mode: ForwardMode, new_tokens: dict[int, object]) -> torch.Tensor:
        """One forward; all or nothing: on any error every request keeps its length and pages."""
        new_tokens = self._as_ids(new_tokens)
        check_new_tokens(
            new_tokens,
            mode,
            {req: r.seq_len for req, r in self._requests.items()},
            getattr(self.model.config, "vocab_size", None),
            self.req_to_token_pool.req_to_token.shape[1],
        )
        reqs = [self._requests[r] for r in new_tokens]
        before = [(r.seq_len, len(r.pages)) for r in reqs]
        try:
            return self._run(mode, reqs, new_tokens)
        except BaseException:
            for r, (seq_len, pages) in zip(reqs, before):
                self.allocator.free(r.pages[pages:])
                del r.pages[pages:]
                r.seq_len = seq_len
            raise

    def _run(self, mode: ForwardMode, reqs: list[_Request], new_tokens: dict[int, torch.Tensor]) -> torch.Tensor:
        prefix = [r.seq_len for r in reqs]
        lens = [int(t.numel()) for t in new_tokens.values()]
        locs = [self._grow(r, n) for r, n in zip(reqs, lens)]
        as_i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=self.device)  # noqa: E731
        seq = [p + n for p, n in zip(prefix, lens)]
        self.batch = ForwardBatch(
            forward_mode=mode,
            batch_size=len(reqs),
            req_pool_indices=torch.tensor([r.row for r in reqs], dtype=torch.int64, device=self.device),
            seq_lens=as_i32(seq),
            seq_lens_cpu=torch.tensor(seq, dtype=torch.int32),
            extend_prefix_lens=as_i32(prefix),
            extend_seq_lens=as_i32(lens),
            out_cache_loc=torch.cat(locs).to(self.device),
            extend_seq_lens_cpu=lens,
        )
        self.backend.init_forward_metadata(self.batch)
        ids = torch.cat([t.reshape(-1) for t in new_tokens.values()]).to(self.device)[None]
        positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix, lens)]).to(self.device)[None]
        token = _ACTIVE.set(self)
        try:  # a torch.compile'd model runs eagerly here: its graphs attend over transformers' cache, not this pool
            with torch.no_grad(), torch.compiler.set_stance("force_eager"):
                out = self.model(input_ids=ids, position_ids=positions, **self._call_kwargs())
        finally:
            _ACTIVE.reset(token)
        result = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
        return result[0]

    def _call_kwargs(self) -> dict[str, Any]:
        return {"use_cache": False} if getattr(self.model.config, "use_cache", None) is not None else {}

    def _grow(self, r: _Request, n: int) -> torch.Tensor:
        """Allocate slots for ``n`` more tokens of ``r`` (new pages as needed); returns their slots."""
        end = r.seq_len + n
        need = -(-end // self.page_size) - len(r.pages)
        if need > 0:
            r.pages += self.allocator.alloc_pages(need)
        slots = torch.tensor(
            [r.pages[i // self.page_size] * self.page_size + i % self.page_size for i in range(r.seq_len, end)],
            dtype=torch.int64,
        )
        self.req_to_token_pool.req_to_token[r.row, r.seq_len : end] = slots.to(torch.int32).to(
            self.req_to_token_pool.req_to_token.device
        )
        r.seq_len = end
        return slots

    def _ckv_hook(self, idx: int):
        def hook(_module, _inputs, output: torch.Tensor) -> None:
            self._ckv[idx] = output.reshape(-1, output.shape[-1])  # [num_tokens, kv_lora_rank]

        return hook

    def take_ckv(self, layer_id: int) -> torch.Tensor:
        """The normalized latent ckv ``[num_tokens, kv_lora_rank]`` of this forward's tokens at an MLA layer."""
        ckv = self._ckv.pop(layer_id, None)
        if ckv is None:
            raise RuntimeError(f"layer {layer_id}: no latent captured from kv_a_layernorm in this forward")
        return ckv

    def layer_for(self, module: torch.nn.Module, scaling: float | None) -> AttentionLayer:
        """The layer spec of a transformers attention module (bound at construction)."""
        layer = self.layers[module.layer_idx]
        if scaling is not None and abs(float(scaling) - layer.scaling) > 1e-12 * max(1.0, abs(layer.scaling)):
            raise RuntimeError(
                f"layer {module.layer_idx}: the model passed scaling {scaling}, the bound layer has {layer.scaling}"
            )
        return layer


def _scattered(num_pages: int) -> list[int]:
    """A fixed, non-monotonic page order (odd pages descending, then even ones), so request pages are scattered."""
    return list(range(num_pages - 1, -1, -2)) + list(range(num_pages - 2, -1, -2))


try:  # transformers looks implementations up by name: be there once this module is imported
    register()
except ImportError:  # transformers is a test/optional dependency
    pass
