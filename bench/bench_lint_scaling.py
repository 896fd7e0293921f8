"""How `attngate lint` scales with the rule base: the shipped rules.yaml plus N generated rules, in these shapes:

- ``tuning``: a per-model / per-GPU tuning table: rules over several gates, each under its own conjunction of
  architecture, page size, TP size and model facts (no two rules of one gate can match together);
- ``one_gate``: N rules that each give one gate its own value under mutually exclusive page sizes (the shape whose
  pairwise encoding was quadratic);
- ``conjunction``: ``one_gate``'s exclusivity inside a conjunction of another fact
  (``not enable_deterministic_inference and model_type == "mN"``, ``backends: [flashinfer]``: a nested conjunction);
- ``mixed``: three families keyed on different facts (page size, model type, TP size), each behind its own attention
  backend, with the keys nested in conjunctions, as ``in (single,)`` and under a negated disjunction;
- ``sets``: ``one_gate``'s exclusivity by sets of values: ``model_type in ("mN", "nN")``, and ``model_type == "p"``
  with a disjunction of equalities ``page_size == A or page_size == B``;
- ``conflicting``: N rules that all set one gate to different values under overlapping conditions: every rule
  conflicts, and lint must report them all;
- ``conflicts_shipped``: N rules ``page_size == N`` that each meet the shipped rule setting the same gate
  (flashinfer.deterministic-split-sizes): one real conflict per rule, every one reported.

Prints one JSON object (seconds per shape and size, and the shapes at 400 rules against the shipped file, timed
alternately: the medians and their ratios) and, given a path, draws it:

    python bench/bench_lint_scaling.py > lint.json
    python bench/bench_lint_scaling.py --plot bench/lint_scaling.png < lint.json     # needs the bench extra
    python bench/bench_lint_scaling.py --ratios 5                                    # only the ratios at 400
"""

from __future__ import annotations

import json
import multiprocessing
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attngate.analysis.lint import lint_rules  # noqa: E402
from attngate.rules.load import parse_rules, shipped_rules_path  # noqa: E402

SIZES = (100, 300, 1000, 3000, 10000)
#: (shape, sizes, conflicting pairs lint must report at size n)
SHAPES = (
    ("tuning", SIZES, lambda n: 0),
    ("one_gate", SIZES, lambda n: 0),
    ("conjunction", SIZES, lambda n: 0),
    ("mixed", SIZES, lambda n: 0),
    ("sets", SIZES, lambda n: 0),
    ("conflicting", (30, 60, 120), lambda n: n * (n - 1) // 2),
    ("conflicts_shipped", (100, 300, 1000, 3000), lambda n: n),
)
#: the shapes of issue 53 at 400 rules, against the shipped file alone (target: at most 5x)
AT_400 = ("one_gate", "conjunction", "mixed", "sets", "conflicts_shipped")
ARCHS = ("sm80", "sm90", "sm100", "sm120")
GATES = (  # (gate, value of rule i): gates a tuning table sets
    ("flashinfer.prefill_fixed_split_size", lambda i: 1024 + i),
    ("flashinfer.decode_fixed_split_size", lambda i: 512 + i),
)


def _rule(i: int, when: str, gate: str, value: object, backends: str = "") -> str:
    scoped = f"\n    backends: [{backends}]" if backends else ""
    return (
        f"\n  - id: gen.r{i}\n    summary: s\n    when: {when}{scoped}\n    set: {{{gate}: {value}}}\n    why: w\n"
        "    source: s\n"
    )


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
        elif shape == "conjunction":  # backends: wraps the condition in one more conjunction, as FlashInfer rules are
            when = f'not enable_deterministic_inference and model_type == "m{i}"'
            rules.append(_rule(i, when, "flashinfer.prefill_fixed_split_size", 1000 + i, backends="flashinfer"))
        elif shape == "mixed":
            when = (
                f'not enable_deterministic_inference and (attention_backend == "fa3" and page_size in ({1000 + i},))',
                f'not enable_deterministic_inference and attention_backend == "flashinfer" and model_type == "m{i}"',
                f'not (enable_deterministic_inference or attention_backend != "triton") and tp_size == {1 + i}',
            )[i % 3]
            rules.append(_rule(i, when, "flashinfer.prefill_fixed_split_size", 1000 + i))
        elif shape == "sets":
            when = (
                f'not enable_deterministic_inference and model_type in ("m{i}", "n{i}")',
                f'not enable_deterministic_inference and model_type == "p" and (page_size == {2000 + 2 * i} or page_size == {2001 + 2 * i})',
            )[i % 2]
            rules.append(_rule(i, when, "flashinfer.prefill_fixed_split_size", 1000 + i))
        elif shape == "conflicts_shipped":  # each meets flashinfer.deterministic-split-sizes (4096)
            rules.append(_rule(i, f"page_size == {1000 + i}", "flashinfer.prefill_fixed_split_size", 1000 + i))
        elif shape == "conflicting":  # every rule matches wherever page_size >= 4096, each with its own value
            when = f"page_size is not None and page_size >= 4096 and tp_size >= {1 + i % 2} and not enable_deterministic_inference"
            rules.append(_rule(i, when, "flashinfer.prefill_fixed_split_size", 1000 + i))
        else:
            raise ValueError(f"no shape {shape!r}")
    return head + "".join(rules) + "\ndeviations:\n" + rest


def lint_seconds(text: str) -> tuple[float, int]:
    """Seconds of one lint and the conflicting pairs it reports (one finding per gate lists its pairs), in a fresh
    interpreter: z3's context keeps growing across lints in one process (after a lint of 10,000 rules the next lint of
    100 takes twice as long), which would charge each shape for the ones before it."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_lint_here, text).result()


def _lint_here(text: str) -> tuple[float, int]:
    rules = parse_rules(text, "rules.yaml")
    t0 = time.perf_counter()
    findings = lint_rules(rules)
    pairs = sum(int(f.message.split()[0]) if f.message.split()[0].isdigit() else 1 for f in findings)
    return round(time.perf_counter() - t0, 2), pairs


def ratios(repeat: int) -> dict:
    """The shapes of issue 53 at 400 rules against the shipped file alone, each lint timed ``repeat`` times, the
    files alternating within each round so that drift during the run favours none: medians and their ratios."""
    texts = {"shipped": shipped_rules_path().read_text(), **{s: generated(s, 400) for s in AT_400}}
    times: dict[str, list[float]] = {name: [] for name in texts}
    for _ in range(repeat):
        for name, text in texts.items():
            seconds, pairs = lint_seconds(text)
            assert pairs == (400 if name == "conflicts_shipped" else 0), (name, pairs)  # every conflicting pair
            times[name].append(seconds)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    return {
        "repeat": repeat,
        "median_s": medians,
        "ratio_to_shipped": {s: round(medians[s] / medians["shipped"], 2) for s in AT_400},
        "seconds": times,
    }


def main() -> None:
    base, base_findings = lint_seconds(shipped_rules_path().read_text())
    assert base_findings == 0
    out: dict = {
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "shipped_s": base,
        **{shape: {} for shape, _, _ in SHAPES},
    }
    for shape, sizes, expected in SHAPES:
        for n in sizes:
            seconds, findings = lint_seconds(generated(shape, n))
            out[shape][n] = {"seconds": seconds, "conflicting_pairs": findings}
            assert findings == expected(n), (shape, n, findings)  # every pair, and no other finding
            print(f"{shape} {n}: {seconds} s, {findings} conflicting pairs", file=sys.stderr)
    out["at_400"] = ratios(3)
    print(json.dumps(out, indent=2))


def plot(dst: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(sys.stdin)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {
        "tuning": "C0-o",
        "one_gate": "C1-s",
        "conjunction": "C2-D",
        "mixed": "C4-v",
        "conflicting": "C3-^",
        "conflicts_shipped": "C5-P",
    }
    for shape, style in styles.items():
        if shape not in data:  # an older JSON file lacks the newer shapes
            continue
        sizes = sorted(data[shape], key=int)
        ax.plot([int(n) for n in sizes], [data[shape][n]["seconds"] for n in sizes], style, label=shape)
    ax.axhline(data["shipped_s"], color="grey", linestyle=":", label="shipped rules.yaml alone")
    ax.set(xscale="log", yscale="log", xlabel="generated rules added to rules.yaml", ylabel="lint seconds")
    ax.set_title(f"attngate lint scaling ({data['machine']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--plot"]:
        plot(sys.argv[2])
    elif sys.argv[1:2] == ["--ratios"]:
        print(json.dumps(ratios(int(sys.argv[2])), indent=2))
    else:
        main()
