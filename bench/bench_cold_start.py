"""The cold start of ``attngate explain`` against its dependency floor, measured side by side in one run.

The floor is what any CLI built on the same libraries pays before doing anything: a fresh interpreter importing
pydantic, PyYAML, typer and rich and building (and validating through) one pydantic model. ``explain`` of a real
model config on a named GPU is timed alternately with it, so that drift during the run favours neither; the medians
and their ratio are printed as one JSON object (issue 53's target: at most 1.5x), with where explain's time beyond
the floor goes (``breakdown_ms``: fresh interpreters that import the floor first, then time importing attngate's CLI,
loading the shipped rules, and the rest of the command; medians)::

    python bench/bench_cold_start.py            # 7 rounds (the median of 7)
    python bench/bench_cold_start.py --rounds 11
    python bench/bench_cold_start.py --source   # every attngate module compiled from source on every run

Every interpreter runs from bytecode, as an installed attngate does (pip compiles each module at install, and the
floor's libraries come with theirs): PYTHONDONTWRITEBYTECODE is dropped from their environment and the bytecode goes
to a temporary PYTHONPYCACHEPREFIX, so the checkout is left as it is. A checkout run under PYTHONDONTWRITEBYTECODE
(as the dev machine sets it) compiles attngate's modules from source on every start instead, which ``--source``
measures (the environment as it is). The warm-up run also leaves the shipped rules in attngate's disk cache
(attngate.rules.cache), where every run after a first finds them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLOOR = "import pydantic, yaml, typer, rich\nclass M(pydantic.BaseModel):\n    x: int = 0\nM(x=1)\n"
EXPLAIN = ("-m", "attngate", "explain", "--gpu", "sm90", "--model", "examples/models/Llama-3.1-8B.json")
PHASES = FLOOR + (
    "import json, os, sys, time\n"
    "t0 = time.perf_counter()\n"
    "import attngate.cli\n"
    "import attngate.rules.load as load\n"
    "t1 = time.perf_counter()\n"
    "load.load_rules()  # cached: the command's own load_rules call finds it parsed\n"
    "t2 = time.perf_counter()\n"
    "sys.stdout = open(os.devnull, 'w')\n"
    "try:\n"
    f"    attngate.cli.main({list(EXPLAIN[2:])!r})\n"
    "except SystemExit:\n"
    "    pass\n"
    "t3 = time.perf_counter()\n"
    "ms = {'import_attngate_cli': t1 - t0, 'load_shipped_rules': t2 - t1, 'rest_of_explain': t3 - t2}\n"
    "print(json.dumps({k: round(v * 1000, 1) for k, v in ms.items()}), file=sys.stderr)\n"
)


def wall_s(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--source", action="store_true", help="the environment as it is (no bytecode written)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="attngate-bench-pyc-") as pycache:
        env = dict(os.environ)
        if not options.source:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = pycache
        out = measure(options.rounds, env)
    out["bytecode"] = "as the environment has it" if options.source else "compiled once, as installed"
    print(json.dumps(out, indent=2))


def measure(rounds: int, env: dict[str, str]) -> dict:
    commands = {
        "python_pass": [sys.executable, "-c", "pass"],
        "floor": [sys.executable, "-c", FLOOR],
        "explain": [sys.executable, *EXPLAIN],
    }
    for argv in commands.values():  # warm the file cache (and .pyc files) before any timing
        wall_s(argv, env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, argv in commands.items():
            times[name].append(wall_s(argv, env))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    phases = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", PHASES], cwd=ROOT, check=True, capture_output=True, text=True, env=env
            ).stderr.splitlines()[-1]
        )
        for _ in range(rounds)
    ]
    out = {
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "rounds": rounds,
        "command": " ".join(["python", *EXPLAIN]),
        **{f"{name}_median_s": round(m, 4) for name, m in medians.items()},
        "explain_over_floor": round(medians["explain"] / medians["floor"], 2),
        "breakdown_ms": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
        **{f"{name}_s": [round(t, 4) for t in ts] for name, ts in times.items()},
    }
    return out


if __name__ == "__main__":
    main()
