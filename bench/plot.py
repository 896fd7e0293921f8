"""Draw a benchmark's JSON as one PNG. Runs anywhere matplotlib is installed (``pip install -e .[bench]``):

    python3 bench/bench_host.py > host.json        # on the GPU
    python3 bench/plot.py host.json bench/host_overhead.png
    python3 bench/plot.py --transformers bench/transformers_plain_h100.json bench/transformers_plain.png
    python3 bench/plot.py --generate bench/transformers_generate_h100.json bench/transformers_generate.png

bench_host.py: host µs per decode step and backend/raw GPU-time ratio over batch size, FlashInfer and FA side by
side. bench_transformers_plain.py: attngate's speed-up over sdpa (sdpa ms / attngate ms, each in the same mode) over
prompt length, decode and prefill, one line per mode and batch size. bench_transformers_generate.py: the same ratio
(the reference's ms / attngate's) of generate()'s decode step per cache and of its prefill, one line per architecture
and batch size, and (wide, faint) the reference's step over one whose attention costs nothing where it was measured
(``--bound``: the most any attention could gain).
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HOST_SERIES = (  # (table, key, label, style)
    ("flashinfer_us", "eager_metadata", "FlashInfer init_forward_metadata", "C0-o"),
    ("flashinfer_us", "raw_plan", "FlashInfer raw plan()", "C0:o"),
    ("flashinfer_us", "raw_plan_auto_family", "FlashInfer raw plan(), 'auto' decode family", "C0--"),
    ("flashinfer_us", "replay_replan", "FlashInfer graph re-plan", "C1-s"),
    ("flashinfer_us", "replay_replan_by_plan", "FlashInfer graph re-plan through plan()", "C1-."),
    ("flashinfer_us", "raw_graph_plan", "FlashInfer raw plan(), graph wrapper", "C1:s"),
    ("flashinfer_us", "raw_graph_fast_plan", "FlashInfer raw fast_decode_plan + its copy, graph wrapper", "C1--"),
    ("fa_us", "eager_step", "FA metadata + forward", "C2-^"),
    ("fa_us", "raw_call", "FA raw kernel call", "C2:^"),
    ("fa_us", "raw_write_and_call", "FA raw KV write + kernel call", "C2--"),
    ("fa_us", "replay_step", "FA graph replay incl. metadata", "C3-v"),
)
RATIO_SERIES = (
    ("flashinfer_us", "gpu_forward_ms", "gpu_raw_run_ms", "FlashInfer forward / run()", "C0-o"),
    ("fa_us", "gpu_forward_ms", "gpu_raw_ms", "FA forward / raw call", "C2-^"),
)


def main(src: str, dst: str) -> None:
    data = json.load(open(src))
    fig, (host, ratio) = plt.subplots(1, 2, figsize=(13, 6.2))
    for table, key, label, style in HOST_SERIES:
        rows = data[table]
        sizes = sorted(rows, key=int)
        if key in rows[sizes[0]]:  # older JSON files lack the newer series
            host.plot([int(b) for b in sizes], [rows[b][key] for b in sizes], style, label=label)
    host.set(
        xscale="log",
        xlabel="batch size (decode requests)",
        ylabel="host µs per step (one layer)",
        title="Host time per decode step",
    )
    host.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    for table, num, den, label, style in RATIO_SERIES:
        rows = data[table]
        sizes = sorted(rows, key=int)
        ratio.plot([int(b) for b in sizes], [rows[b][num] / rows[b][den] for b in sizes], style, label=label)
    ratio.axhline(1.03, color="grey", linestyle="--", linewidth=0.8, label="1.03 (target)")
    ratio.set(
        xscale="log",
        xlabel="batch size (decode requests)",
        ylabel="GPU time, backend / raw",
        title="Backend / raw, GPU time (KV write incl.; launch-bound below 64)",
    )
    ratio.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.suptitle(f"{data['gpu']}, torch {data['torch']}, {data['cached_tokens']} cached tokens per request")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


def transformers_plain(src: str, dst: str) -> None:
    data = json.load(open(src))
    fig, panels = plt.subplots(1, 2, figsize=(13, 5.6))
    styles = {"eager": ":", "compiled": "--", "cudagraphs": "-"}
    for panel, table, title in zip(panels, ("decode_ms", "prefill_ms"), ("decode step", "prefill")):
        rows = data[table]
        for mode, line in styles.items():
            for i, batch in enumerate(data["batches"]):
                points = [
                    (p, rows[f"sdpa {mode} b{batch} p{p}"] / rows[f"attngate {mode} b{batch} p{p}"])
                    for p in data["prompts"]
                    if isinstance(rows.get(f"sdpa {mode} b{batch} p{p}"), float)
                    and isinstance(rows.get(f"attngate {mode} b{batch} p{p}"), float)
                ]
                if points:
                    xs, ys = zip(*points)
                    panel.plot(xs, ys, f"C{i}{line}o", label=f"{mode}, batch {batch}")
        panel.axhline(1.0, color="grey", linewidth=0.8)
        panel.set(xscale="log", xlabel="prompt tokens", ylabel="sdpa ms / attngate ms", title=title)
        panel.legend(fontsize=7)
    fig.suptitle(f"attn_implementation='attngate' against sdpa, {data['gpu']}, torch {data['torch']}")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


def transformers_generate(src: str, dst: str) -> None:
    data = json.load(open(src))
    rows = [row for row in data["rows"] if "error" not in row]
    archs = sorted({row["arch"] for row in rows})
    batches = sorted({row["batch"] for row in rows})
    fig, panels = plt.subplots(1, 3, figsize=(17, 5.6))
    for panel, (cache, ratio, title) in zip(
        panels,
        (
            ("default", "decode_ratio", "decode step, DynamicCache (eager)"),
            ("static", "decode_ratio", "decode step, static cache (compiled)"),
            (None, "prefill_ratio", "prefill, both caches"),
        ),
    ):
        for a, arch in enumerate(archs):
            for b, batch in enumerate(batches):
                for c, kind in enumerate((cache,) if cache else ("default", "static")):
                    points = sorted(
                        (row["prompt"], row[ratio])
                        for row in rows
                        if (row["arch"], row["batch"], row["cache"]) == (arch, batch, kind)
                    )
                    if points:
                        xs, ys = zip(*points)
                        style = ("-", "--", ":")[a % 3] + "osv^"[c if cache is None else b % 4]
                        label = f"{arch}, batch {batch}" + ("" if cache else f", {kind}")
                        panel.plot(xs, ys, f"C{b}{style}", label=label)
                    bound = sorted(
                        (row["prompt"], row["decode_bound"])
                        for row in rows
                        if (row["arch"], row["batch"], row["cache"]) == (arch, batch, cache) and "decode_bound" in row
                    )
                    if bound and ratio == "decode_ratio":  # what an attention costing nothing would reach
                        xs, ys = zip(*bound)
                        panel.plot(xs, ys, f"C{b}" + ("-", "--", ":")[a % 3], alpha=0.3, linewidth=3)
        panel.axhline(1.0, color="grey", linewidth=0.8)
        panel.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="reference ms / attngate ms", title=title)
        panel.legend(fontsize=7)
    fig.suptitle(f"generate(), attn_implementation='attngate' against sdpa, {data['device']}, torch {data['torch']}")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if sys.argv[1] == "--transformers":
        transformers_plain(*sys.argv[2:4])
    elif sys.argv[1] == "--generate":
        transformers_generate(*sys.argv[2:4])
    else:
        main(*sys.argv[1:3])
