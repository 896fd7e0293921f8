"""How `attngate lint` scales with the rule base: the shipped rules.yaml plus N generated rules, three shapes:

- ``tuning``: a per-model / per-GPU tuning table: rules over several gates, each under its own conjunction of
  architecture, page size, TP size and model facts (no two rules of one gate can match together);
- ``one_gate``: N rules that each give one gate its own value under mutually exclusive page sizes (the shape whose
  pairwise encoding was quadratic);
- ``conflicting``: N rules that all set one gate to different values under overlapping conditions: every rule
  conflicts, and lint must report them all.

Prints one JSON object (seconds per shape and size) and, given a path, draws it:

    python bench/bench_lint_scaling.py > lint.json
    python bench/bench_lint_scaling.py --plot bench/lint_scaling.png < lint.json     # needs the bench extra
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attngate.analysis.lint import lint_rules  # noqa: E402
from attngate.rules.load import parse_rules, shipped_rules_path  # noqa: E402

SIZES = (100, 300, 1000, 3000, 10000)
ARCHS = ("sm80", "sm90", "sm100", "sm120")
GATES = (  # (gate, value of rule i): gates a tuning table sets
    ("flashinfer.prefill_fixed_split_size", lambda i: 1024 + i),
    ("flashinfer.decode_fixed_split_size", lambda i: 512 + i),
)


def _rule(i: int, when: str, gate: str, value: object) -> str:
    return f"\n  - id: gen.r{i}\n    summary: s\n    when: {when}\n    set: {{{gate}: {value}}}\n    why: w\n    source: s\n"


def generated(shape: str, n: int) -> str:
    """rules.yaml with ``n`` rules of ``shape`` appended to its rules (before ``deviations:``)."""
    text = shipped_rules_path().read_text()
    head, rest = text.split("\ndeviations:\n")
    rules = []
    for i in range(n):
        if shape == "tuning":  # one cell of a (gate, arch, page size, TP size) table: rules of one gate never overlap
            gate, value = GATES[i % len(GATES)]
            j = i // len(GATES)
            when = (
                f'gpu_arch == "{ARCHS[j % 4]}" and page_size is not None and page_size == {16 + j // 4 % 64} '
                f"and tp_size == {1 + j // 256} and num_attention_heads >= 8 and not use_mla"
                " and not enable_deterministic_inference"
            )
            rules.append(_rule(i, when, gate, value(j)))
        elif shape == "one_gate":
            when = f"page_size is not None and page_size == {1000 + i} and not use_mla and not enable_deterministic_inference"
            rules.append(_rule(i, when, "flashinfer.prefill_fixed_split_size", 1000 + i))
        else:  # conflicting: every rule matches wherever page_size >= 4096, each with its own value
            when = f"page_size is not None and page_size >= 4096 and tp_size >= {1 + i % 2} and not enable_deterministic_inference"
            rules.append(_rule(i, when, "flashinfer.prefill_fixed_split_size", 1000 + i))
    return head + "".join(rules) + "\ndeviations:\n" + rest


def lint_seconds(text: str) -> tuple[float, int]:
    """Seconds of one lint and the conflicting pairs it reports (one finding per gate lists its pairs)."""
    rules = parse_rules(text, "rules.yaml")
    t0 = time.perf_counter()
    findings = lint_rules(rules)
    pairs = sum(int(f.message.split()[0]) if f.message.split()[0].isdigit() else 1 for f in findings)
    return round(time.perf_counter() - t0, 2), pairs


def main() -> None:
    base, base_findings = lint_seconds(shipped_rules_path().read_text())
    assert base_findings == 0
    out: dict = {
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "shipped_s": base,
        "tuning": {},
        "one_gate": {},
        "conflicting": {},
    }
    for shape, sizes in (("tuning", SIZES), ("one_gate", SIZES), ("conflicting", (30, 60, 120))):
        for n in sizes:
            seconds, findings = lint_seconds(generated(shape, n))
            out[shape][n] = {"seconds": seconds, "conflicting_pairs": findings}
            assert findings == (n * (n - 1) // 2 if shape == "conflicting" else 0), (shape, n, findings)  # every pair
            print(f"{shape} {n}: {seconds} s, {findings} conflicting pairs", file=sys.stderr)
    print(json.dumps(out, indent=2))


def plot(dst: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(sys.stdin)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for shape, style in (("tuning", "C0-o"), ("one_gate", "C1-s"), ("conflicting", "C3-^")):
        sizes = sorted(data[shape], key=int)
        ax.plot([int(n) for n in sizes], [data[shape][n]["seconds"] for n in sizes], style, label=shape)
    ax.axhline(data["shipped_s"], color="grey", linestyle=":", label="shipped rules.yaml alone")
    ax.set(xscale="log", yscale="log", xlabel="generated rules added to rules.yaml", ylabel="lint seconds")
    ax.set_title(f"attngate lint scaling ({data['machine']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    plot(sys.argv[2]) if sys.argv[1:2] == ["--plot"] else main()
