"""The ways a user writes one SGLang launch line, as hypothesis strategies (issue 53 item 10): a line is a list of
:class:`Item` (a flag of SGLang 0.5.23's parser and its values), spelled by :func:`spelled` with a program in front of
it (none, ``python[3[.N]] [-u] -m sglang.launch_server``, ``python -m sglang.cli.main serve``, ``sglang serve`` with
the model as its positional word, a path to ``launch_server.py``), environment assignments and wrapper words before
that, the flags in any order, each under any of its names or an unambiguous prefix of one, ``--flag value`` or
``--flag=value``, and values that look like launchers (``launch_server.py``, ``sglang`` then ``serve``). Option names
and prefixes are read off ``attngate/facts/sglang_flags.json``, the table SGLang's own parser builds
(tests/integrations/sglang/test_launch_line.py checks it is), never off attngate's reader."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from hypothesis import strategies as st

#: flags the rules read (attention-relevant), each with values SGLang takes
READ: dict[str, list[str]] = {
    "attention_backend": ["fa3", "flashinfer", "triton", "fa4", "torch_native"],
    "prefill_attention_backend": ["fa3", "flashinfer", "triton"],
    "decode_attention_backend": ["fa3", "flashinfer", "triton"],
    "page_size": ["1", "16", "64"],
    "tp_size": ["1", "2", "4"],
    "dp_size": ["1", "2"],
    "attn_cp_size": ["1", "2"],
    "kv_cache_dtype": ["auto", "fp8_e4m3", "bf16"],
    "chunked_prefill_size": ["-1", "4096"],
    "context_length": ["4096", "131072"],
    "dtype": ["auto", "bfloat16", "half"],
    "speculative_algorithm": ["EAGLE", "EAGLE3", "NGRAM"],
    "speculative_num_steps": ["1", "3"],
    "speculative_eagle_topk": ["1", "4"],
    "speculative_num_draft_tokens": ["4", "8"],
    "speculative_draft_model_path": ["org/draft", "launch_server.py", "serve"],
    "speculative_attention_mode": ["prefill", "decode"],
    "speculative_accept_threshold_single": ["0.5", "1.0"],
    "cuda_graph_backend_decode": ["full", "disabled"],
    "cuda_graph_backend_prefill": ["full", "breakable"],
    "max_running_requests": ["8", "256"],
    "hicache_io_backend": ["direct", "kernel"],
    "sampling_backend": ["flashinfer", "pytorch"],
    "disaggregation_mode": ["null", "prefill", "decode"],
}
#: values of those flags that SGLang refuses, or takes in a spelling of its own (argparse's int() and float())
ODD: dict[str, list[str]] = {
    "attention_backend": ["fa9", "cutlass_mla", "FA3"],
    "page_size": ["x", "0", "2.0", "+16", "016", " 16", "1_6", "\uff11\uff16", "1e1"],
    "tp_size": ["-1", "0x2"],
    "chunked_prefill_size": ["-2", "4_096"],
    "kv_cache_dtype": ["fp4_e2m1"],
    "speculative_algorithm": ["UNO"],
    "speculative_accept_threshold_single": ["nan", "1_0.5", ".5", "2"],
}
#: switches the rules read
SWITCHES = [
    "is_embedding",
    "disable_radix_cache",
    "enable_deterministic_inference",
    "enable_torch_compile",
    "disable_cuda_graph",
    "enable_dp_attention",
    "enable_mixed_chunk",
    "flashinfer_mla_disable_ragged",
    "enable_hierarchical_cache",
    "disable_chunked_prefix_cache",
    "enable_prefill_cp",
]
#: flags no rule reads, with values that look like a launcher, a flag or a shell word
NOT_READ: dict[str, list[str]] = {
    "served_model_name": [
        "launch_server.py",
        "/x/sglang/launch_server.py",
        "sglang",
        "serve",
        "python",
        "python3 -m sglang.launch_server",
        "my model",
        "a=b",
        "",
        "-m",
        "--tp",
        "--tp 4",  # a word holding a space is a value to argparse, whatever it starts with
        "-x y",
        "--tp=4 x",
    ],
    "tokenizer_path": ["serve", "launch_server.py", "./launch_server.py", "sglang"],
    "host": ["0.0.0.0"],
    "port": ["30000"],
}
MULTI = {"lora_paths": ["sglang", "serve", "launch_server.py", "python"]}  # nargs *: a value `serve` after `sglang`
MODELS = ["org/model", "/models/sglang/launch_server.py", "serve", "sglang", "my model"]


@dataclass(frozen=True)
class Item:
    """One flag of a line: its argparse dest and values (None: a switch)."""

    dest: str
    values: tuple[str, ...] | None


@dataclass(frozen=True)
class Spelled:
    """A line as written: ``env`` (assignments and wrapper words), ``program`` (the launcher's words; ``kind`` none,
    module or serve) and ``args`` (what follows it). ``words``: all of them; ``line``: them quoted for a shell."""

    env: tuple[str, ...]
    program: tuple[str, ...]
    kind: str
    args: tuple[str, ...]
    line: str

    @property
    def words(self) -> list[str]:
        return [*self.env, *self.program, *self.args]


@cache
def options() -> dict[str, tuple[str, ...]]:
    """Every dest of SGLang 0.5.23's parser and its option strings."""
    raw = json.loads(resources.files("attngate.facts").joinpath("sglang_flags.json").read_text())
    return {a["dest"]: tuple(a["options"]) for a in raw["actions"]}


@cache
def _all_options() -> tuple[str, ...]:
    return tuple(o for names in options().values() for o in names)


@cache
def unambiguous_prefixes(dest: str) -> tuple[str, ...]:
    """The names of ``dest``: its option strings, and each prefix (3 characters past ``--`` or more) that starts
    exactly one option string of the parser (argparse's allow_abbrev takes it for that option)."""
    out = list(options()[dest])
    for option in options()[dest]:
        for end in range(5, len(option)):
            prefix = option[:end]
            if prefix.endswith("-"):
                continue
            if [o for o in _all_options() if o.startswith(prefix)] == [option]:
                out.append(prefix)
    return tuple(out)


def _needs_inline(value: str) -> bool:
    """A value argparse would take for an option: only ``--flag=value`` passes it (``-1`` is a number, a value)."""
    return value.startswith("-") and not value[1:2].isdigit()


ITEM = st.one_of(
    st.sampled_from(sorted(READ)).flatmap(lambda d: st.sampled_from(READ[d]).map(lambda v: Item(d, (v,)))),
    st.sampled_from(sorted(ODD)).flatmap(lambda d: st.sampled_from(ODD[d]).map(lambda v: Item(d, (v,)))),
    st.sampled_from(SWITCHES).map(lambda d: Item(d, None)),
    st.sampled_from(sorted(NOT_READ)).flatmap(lambda d: st.sampled_from(NOT_READ[d]).map(lambda v: Item(d, (v,)))),
    st.sampled_from(sorted(MULTI)).flatmap(
        lambda d: st.lists(st.sampled_from(MULTI[d]), max_size=3).map(lambda vs: Item(d, tuple(vs)))
    ),
)
#: a line's flags, each dest once (the order then never decides which value wins)
ITEMS = st.lists(ITEM, max_size=8, unique_by=lambda item: item.dest)

PROGRAMS: list[tuple[tuple[str, ...], str]] = [
    ((), "none"),
    (("python", "-m", "sglang.launch_server"), "module"),
    (("python3", "-m", "sglang.launch_server"), "module"),
    (("/usr/bin/python3.11", "-u", "-m", "sglang.launch_server"), "module"),
    (("python3", "-msglang.launch_server"), "module"),
    (("python", "/x/sglang/launch_server.py"), "module"),
    (("./launch_server.py",), "module"),
    (("python", "-m", "sglang.cli.main", "serve"), "serve"),
    (("sglang", "serve"), "serve"),
    (("/opt/venv/bin/sglang", "serve"), "serve"),
]
ASSIGNMENTS = [
    "A=1",
    "SGLANG_FLASHINFER_USE_PAGED=1",
    "CUDA_VISIBLE_DEVICES=0,1",
    "X=/x/launch_server.py",
    "Y=sglang serve",
]
WRAPPERS = [(), ("env",), ("env", "-i"), ("env", "-u", "HOME"), ("nohup",), ("uv", "run"), ("time",)]


def _quoted(draw: Any, word: str) -> str:
    """``word`` as a shell would take it back: bare where it is safe, else in single or double quotes (a
    ``--flag=value`` word may have its value alone quoted)."""
    style = draw(st.sampled_from(["plain", "single", "double", "value"]))
    safe = word and all(c.isalnum() or c in "-_=./,:+" for c in word)
    if style == "plain" and safe:
        return word
    if style == "value" and word.startswith("--") and "=" in word:
        flag, _, value = word.partition("=")
        return f"{flag}={shlex.quote(value)}"
    if style == "double" and not any(c in word for c in '"\\$`!'):
        return f'"{word}"'
    return shlex.quote(word)


@st.composite
def spelled(draw: Any, items: list[Item], model: str | None, *, programs: list | None = None) -> Spelled:
    """One spelling of the line of ``items`` and ``--model-path model`` (None: no model path)."""
    program, kind = draw(st.sampled_from(programs or PROGRAMS))
    env = list(draw(st.lists(st.sampled_from(ASSIGNMENTS), max_size=2)))
    if kind != "none":  # a wrapper needs a program after it
        wrapper = draw(st.sampled_from(WRAPPERS))
        env += [
            *wrapper,
            *(draw(st.lists(st.sampled_from(ASSIGNMENTS), max_size=1)) if wrapper[:1] == ("env",) else []),
        ]
    flags = [*items, *([Item("model_path", (model,))] if model is not None else [])]
    flags = draw(st.permutations(flags))
    args: list[str] = []
    positional = None
    if kind == "serve" and model is not None and draw(st.booleans()):  # sglang serve MODEL: its first word
        flags = [f for f in flags if f.dest != "model_path"]
        positional = model
    for item in flags:
        name = draw(st.sampled_from(unambiguous_prefixes(item.dest)))
        if item.values is None:
            args.append(name)
        elif len(item.values) == 1 and (_needs_inline(item.values[0]) or draw(st.booleans())):
            args.append(f"{name}={item.values[0]}")
        else:
            args += [name, *item.values]
    if positional is not None:
        if positional.startswith("-"):  # not a positional to SGLang either
            args = ["--model-path", positional, *args]
        else:
            args = [positional, *args]
    if kind == "serve":  # sglang serve takes --model-type out wherever it stands; the LLM server is the one planned
        model_type = draw(st.sampled_from([(), ("--model-type", "llm"), ("--model-type=auto",)]))
        args = [*model_type, *args] if draw(st.booleans()) else [*args, *model_type]
    words = [*env, *program, *args]
    line = " ".join(_quoted(draw, w) for w in words)
    return Spelled(tuple(env), program, kind, tuple(args), line)


def canonical(items: list[Item], model: str | None) -> list[str]:
    """The line as SGLang's arguments alone, each flag under its first name, in order."""
    out: list[str] = []
    for item in [*items, *([Item("model_path", (model,))] if model is not None else [])]:
        name = options()[item.dest][0]
        if item.values is None:
            out.append(name)
        elif len(item.values) == 1 and _needs_inline(item.values[0]):
            out.append(f"{name}={item.values[0]}")
        else:
            out += [name, *item.values]
    return out
