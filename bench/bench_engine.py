"""Engine benchmarks on the shipped rules: load + type-check, resolve(), explanation, lint (with the
invariant proofs) of the shipped file and of the file plus 400 more rules on one gate (two values, or 400
distinct ones), and the cold start of
`attngate explain` against `python -c pass` in the same run. Prints one JSON object."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attngate import ModelFacts, Platform, ServerArgs, resolve  # noqa: E402
from attngate.analysis.lint import lint_rules  # noqa: E402
from attngate.rules.load import parse_rules, shipped_rules_path  # noqa: E402


def with_extra_rules(text: str, n: int, *, distinct: bool = False) -> str:
    """The shipped file plus ``n`` rules that never overlap one another (one page size each) and set one gate:
    to two alternating values, or (``distinct``) each to its own. Lint must rule out every pair of value classes
    without checking every pair."""
    head, rest = text.split("\ndeviations:\n")
    extra = "".join(
        f"""
  - id: extra.r{i}
    summary: s
    when: page_size is not None and page_size == {1000 + i} and not use_mla and not enable_deterministic_inference
    set: {{{
            f"flashinfer.prefill_fixed_split_size: {1000 + i}"
            if distinct
            else f"flashinfer.mla_kernel_family: {'fa2' if i % 2 else 'fa3'}"
        }}}
    why: w
    source: s
"""
        for i in range(n)
    )
    return head + extra + "\ndeviations:\n" + rest


def lint_s(text: str, repeat: int = 3) -> float:
    rules = parse_rules(text, "rules.yaml")
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        assert lint_rules(rules) == []
        times.append(time.perf_counter() - t0)
    return round(min(times), 3)


def per_call_us(fn, repeat: int) -> dict[str, float]:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return {
        "median_us": round(statistics.median(samples), 1),
        "p90_us": round(sorted(samples)[int(0.9 * len(samples))], 1),
    }


def wall_s(cmd: list[str], repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 4)


def main() -> None:
    text = shipped_rules_path().read_text()
    rules = parse_rules(text, "rules.yaml")
    model = ModelFacts.from_hf_config(ROOT / "examples/models/Qwen3-Embedding-8B.json")
    args = ServerArgs.from_flags(
        "--is-embedding --chunked-prefill-size -1 --disable-radix-cache --attention-backend fa3".split()
    )
    gpu = Platform.from_name("sm90")
    default_args = ServerArgs()
    explain = [
        sys.executable,
        "-m",
        "attngate",
        "explain",
        "--model",
        "examples/models/Qwen3-Embedding-8B.json",
        "--gpu",
        "sm90",
        "--is-embedding",
        "--chunked-prefill-size",
        "-1",
        "--disable-radix-cache",
        "--attention-backend",
        "fa3",
        "--format",
        "json",
    ]
    explain_s, pass_s = wall_s(explain), wall_s([sys.executable, "-c", "pass"])
    out = {
        "machine": f"{platform.processor() or platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "rules": len(rules.rules),
        "predicates": len(rules.predicates),
        "load_and_typecheck_rules": per_call_us(lambda: parse_rules(text, "rules.yaml"), 30),
        "resolve_explicit_backend": per_call_us(lambda: resolve(args, model, gpu, rules), 300),
        "resolve_default_backend": per_call_us(lambda: resolve(default_args, model, gpu, rules), 300),
        "resolve_plus_explanation": per_call_us(lambda: resolve(args, model, gpu, rules).explanation, 100),
        "lint_shipped_s": (shipped := lint_s(text)),
        "lint_shipped_plus_400_rules_s": (bigger := lint_s(with_extra_rules(text, 400))),
        "lint_ratio": round(bigger / shipped, 2),
        "lint_shipped_plus_400_distinct_values_s": (distinct := lint_s(with_extra_rules(text, 400, distinct=True))),
        "lint_distinct_ratio": round(distinct / shipped, 2),
        "explain_cold_wall_s": explain_s,
        "python_pass_wall_s": pass_s,
        "explain_minus_python_s": round(explain_s - pass_s, 4),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
