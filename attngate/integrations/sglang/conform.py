"""``attngate conform``: every case through SGLang's own resolution and through resolve(), in parallel.

Each case runs in a fresh process forked from one that imported SGLang once (its resolution keeps
module-level state), ``jobs`` at a time; the children leave through os._exit.
"""

from __future__ import annotations

import os
import pickle
import selectors
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attngate.errors import AttngateError, Problem, UsageError, argument_problems, count_problems
from attngate.facts.model import ModelFacts
from attngate.facts.platform import Platform
from attngate.integrations.sglang.cases import Case
from attngate.integrations.sglang.compare import CaseResult, Verdict, compare_case, unreadable_config
from attngate.rules.ruleset import RuleSet

# What a forked worker reads: set by run_cases before the pool forks.
_STATE: dict[str, Any] = {}


@contextmanager
def _model_folders(cases: list[Case]) -> Iterator[dict[Path, Path]]:
    """SGLang reads a model folder: each config.json that is not already one gets a folder of its own."""
    with tempfile.TemporaryDirectory(prefix="attngate-conform-") as tmp:
        folders: dict[Path, Path] = {}
        for path in {c.model_config for c in cases}:
            if path.is_dir() or path.name == "config.json":
                folders[path] = path if path.is_dir() else path.parent
                continue
            folder = Path(tmp) / f"{len(folders)}-{path.stem}"
            folder.mkdir()
            shutil.copyfile(path, folder / "config.json")
            folders[path] = folder
        yield folders


def _run_one(index: int) -> CaseResult:
    from attngate.integrations.sglang.oracle import sglang_resolve

    case: Case = _STATE["cases"][index]
    folder = _STATE["folders"][case.model_config]
    args = {k: str(folder) if v == "{model}" else v for k, v in case.args.items()}  # a draft that is the model itself
    outcome = sglang_resolve(folder, case.gpu, args)
    model = _STATE["models"][case.model_config]
    if isinstance(model, AttngateError):
        problems = "; ".join(map(str, model.problems))
        return unreadable_config(case.name, outcome.resolved, outcome.refusal, problems)
    platform = Platform.from_name(case.gpu, kernels=case.kernels)
    return compare_case(case.name, outcome.given, outcome.resolved, outcome.refusal, model, platform, _STATE["rules"])


def _load_model(path: Path) -> ModelFacts | AttngateError:
    try:
        return ModelFacts.from_hf_config(path)
    except AttngateError as err:
        return err


def run_cases(
    cases: list[Case], rules: RuleSet, *, jobs: int = 1, progress: Callable[[CaseResult], None] | None = None
) -> list[CaseResult]:
    """Run every case through SGLang (needs the sglang extra) and attngate; results in the cases' order.
    Raises UsageError naming every bad argument, then SglangMissingError without SGLang."""
    from attngate.integrations.sglang.oracle import require_sglang

    problems = argument_problems(
        ("cases", cases, list, "from generate_cases() or load_cases()"),
        ("rules", rules, RuleSet, "load a rules file with attngate.load_rules(path)"),
        ("progress", progress, (Callable, type(None)), "a function called with each CaseResult"),
    ) + count_problems(("jobs", jobs, 1))
    if isinstance(cases, list):
        problems += [
            Problem(f"cases[{i}]", f"takes a Case, not {type(c).__name__}", code="usage.argument-type")
            for i, c in enumerate(cases)
            if not isinstance(c, Case)
        ][:10]
    if problems:
        raise UsageError(problems)
    require_sglang()  # before anything imports SGLang (device does)
    from attngate.integrations.sglang.device import preload

    preload()
    with _model_folders(cases) as folders:
        _STATE.update(
            cases=cases,
            folders=folders,
            rules=rules,
            models={p: _load_model(p) for p in {c.model_config for c in cases}},
        )
        results: list[CaseResult | None] = [None] * len(cases)
        for index, result in _forked(range(len(cases)), max(jobs, 1), _run_one):
            results[index] = result
            if progress:
                progress(result)
        _STATE.clear()
    return [r for r in results if r is not None]


def _forked(indices: range, jobs: int, work: Callable[[int], Any]) -> Iterator[tuple[int, Any]]:
    """(index, work(index)) for every index, each run in a child forked for it alone, ``jobs`` at a time, in the order
    they finish. A child leaves through os._exit: no interpreter teardown (seconds with torch imported), no pool."""
    pending, running = iter(indices), {}
    with selectors.DefaultSelector() as selector:
        while True:
            while len(running) < jobs and (index := next(pending, None)) is not None:
                read_fd, write_fd = os.pipe()
                pid = os.fork()
                if pid == 0:  # the child
                    os.close(read_fd)
                    try:
                        payload = pickle.dumps((True, work(index)))
                    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
                        payload = pickle.dumps((False, f"{type(exc).__name__}: {exc}"))
                    with os.fdopen(write_fd, "wb") as out:
                        out.write(payload)
                    os._exit(0)
                os.close(write_fd)
                running[read_fd] = (pid, index, [])
                selector.register(read_fd, selectors.EVENT_READ)
            if not running:
                return
            for key, _ in selector.select():
                pid, index, chunks = running[key.fd]
                chunk = os.read(key.fd, 1 << 20)
                if chunk:
                    chunks.append(chunk)
                    continue
                selector.unregister(key.fd)
                os.close(key.fd)
                os.waitpid(pid, 0)
                del running[key.fd]
                if not chunks:
                    raise RuntimeError(f"case {index}: its worker died without a result")
                ok, value = pickle.loads(b"".join(chunks))
                if not ok:
                    raise RuntimeError(f"case {index} failed in its worker: {value}")
                yield index, value


@dataclass(frozen=True)
class Summary:
    """Counts per verdict, and per field the number of cases where it agreed, differed as declared, or
    differed undeclared."""

    verdicts: dict[str, int]
    fields: dict[str, dict[str, int]]
    undeclared: int
    deviations: dict[str, int]  # cases each declared deviation covered


def summarize(results: list[CaseResult]) -> Summary:
    verdicts = Counter(r.verdict.value for r in results)
    fields: dict[str, Counter] = {}
    for result in results:
        for name in result.differences:
            kind = "declared" if result.declared.get(name) else "undeclared"
            fields.setdefault(name, Counter())[kind] += 1
    undeclared = verdicts[Verdict.DISAGREE.value] + verdicts[Verdict.ONE_REFUSES.value]
    deviations = Counter(i for r in results for i in {i for ids in r.declared.values() for i in ids})
    return Summary(
        {v.value: verdicts[v.value] for v in Verdict},
        {k: dict(v) for k, v in sorted(fields.items())},
        undeclared,
        dict(sorted(deviations.items())),
    )
