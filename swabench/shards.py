"""Spreading a sweep: deterministic shards, one worker process per GPU, job arrays across nodes,
and merging the shards' run folders back into one.

A shard is a set of whole *cases* (a case's implementations share one workload and one GPU).
Cases are dealt longest-first to the least-loaded shard, by their cost in an earlier run when one
is given (``--costs-from``), else by an estimate.  Cases that run an implementation compiled per
process (FlexAttention) stay on one shard per compiled kernel when that fits, so each compile is
paid by one worker, not by every worker.  Each worker writes an ordinary run folder; ``merge`` checks they ran the same scenario
file and unions their rows, keeping each row's GPU identity.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from . import results
from .impls import registry
from .scenarios import Scenario
from .sweep import points_by_case


class ShardError(ValueError):
    pass


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ShardError(f"--shard: expected I/N (e.g. 0/4), got {text!r}") from None
    if not 0 <= i < n:
        raise ShardError(f"--shard: need 0 <= I < N, got {text!r}")
    return i, n


# Estimates for a scenario no earlier run has costed, from default.toml on one H200
# (results/h200x2-default-1gpu): 972 points in 315 s, and 48 s of FlexAttention compile_s over
# about five shape classes.
POINT_S = 0.35
COMPILE_S = 10.0


def case_costs(folder) -> dict[str, float]:
    """Seconds each case took in an earlier run folder: its workload build plus its points."""
    table, _ = results.load(folder)
    if "point_s" not in table:
        raise ShardError(f"--costs-from {folder}: this run has no point_s column (made before swabench "
                         f"recorded it); give a newer run folder, or leave the option out")
    per_case = table.groupby("case_id")
    return (per_case["point_s"].sum() + per_case["workload_s"].first().fillna(0.0)).to_dict()


def _compile_classes(case, points) -> tuple:
    """The per-process compiled kernels the case's implementations run (empty for most cases)."""
    impls = sorted({p.impl for p in points})
    return tuple((name, cls(case)) for name in impls if (cls := registry.get(name).compile_class))


def assign(scenario: Scenario, count: int, costs: dict[str, float] | None = None) -> dict:
    """Case -> shard index: longest first onto the least-loaded shard (ties to the lower index and
    the earlier case, so every process computes the same answer)."""
    by_case = points_by_case(scenario.points)
    cost = {case: (costs or {}).get(case.case_id, POINT_S * len(pts)) for case, pts in by_case.items()}
    groups: dict = {}
    for case, pts in by_case.items():
        key = _compile_classes(case, pts)
        groups.setdefault(key or ("", case.case_id), []).append(case)
    # An estimate holds no compiles: charge one to each group that shares one (measured costs have it).
    charge = COMPILE_S if costs is None else 0.0
    share = (sum(cost.values()) + charge * sum(1 for key in groups if key[0])) / count
    units = []  # (cost, first case's position, cases)
    order = {case: i for i, case in enumerate(by_case)}
    for key, cases in groups.items():
        whole = sum(cost[c] for c in cases) + (charge if key[0] else 0.0)
        # Split a group only when keeping it whole would cost more than paying its compile twice.
        if not key[0] or whole <= share + COMPILE_S:
            units.append((whole, order[cases[0]], cases))
        else:
            units += [(cost[c], order[c], [c]) for c in cases]
    units.sort(key=lambda u: (-u[0], u[1]))
    load, where = [0.0] * count, {}
    for unit_cost, _, cases in units:
        target = min(range(count), key=lambda i: (load[i], i))
        load[target] += unit_cost
        where.update({c: target for c in cases})
    return where


def shard(scenario: Scenario, index: int, count: int, costs: dict[str, float] | None = None) -> Scenario:
    """Keep the points of the cases ``assign`` gives to shard ``index``."""
    where = assign(scenario, count, costs)
    scenario.points = [p for p in scenario.points if where[p.case] == index]
    return scenario


def parse_gpus(spec: str, available: int) -> list[int]:
    """'all' | 'N' (the first N) | '0,2' (these) -> device indices."""
    if spec == "all":
        gpus = list(range(available))
    elif spec.isdigit():
        gpus = list(range(int(spec)))
    else:
        try:
            gpus = [int(g) for g in spec.split(",")]
        except ValueError:
            raise ShardError(f"--gpus: expected all, a count or a list like 0,2; got {spec!r}") from None
    if not gpus or len(set(gpus)) != len(gpus) or any(not 0 <= g < available for g in gpus):
        raise ShardError(f"--gpus {spec}: this node has {available} GPU(s) (0..{available - 1})")
    return gpus


def work_dir(out: Path) -> Path:
    """Where the shards of the merged run ``out`` live (beside it: a run folder holds one run)."""
    return out.with_name(out.name + "-shards")


def rows_written(folder: Path) -> int:
    """Rows a worker has journaled so far (complete lines; a resumed run counts its earlier ones)."""
    try:
        with open(Path(folder) / results.ROWS, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def worker_threads(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


def run_on_gpus(child_args: list[str], gpus: list[int], out: Path,
                on_progress: Callable[[int], None] | None = None, poll_s: float = 1.0) -> list[Path]:
    """One ``swabench run`` per GPU, each seeing only its GPU, each on its own shard; returns their
    run folders once all have finished.  ``on_progress(rows)`` hears the rows journaled so far."""
    work = work_dir(out)
    work.mkdir(parents=True, exist_ok=True)
    procs, folders = [], []
    # Each worker's CPU ops (page tables, lookups, references) get their share of the cores: with
    # every worker running one thread per core, OpenMP's spinning threads slowed both (as torchrun,
    # unless the caller chose).
    threads = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": str(worker_threads(len(gpus)))}
    for i, gpu in enumerate(gpus):
        folder = work / f"gpu{gpu}"
        args = [sys.executable, "-m", "swabench", "run", *child_args, "--shard", f"{i}/{len(gpus)}",
                "--out", str(folder), *(["--resume"] if (folder / results.META).exists() else [])]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "SWABENCH_GPU_ID": str(gpu), **threads}
        log = open(work / f"gpu{gpu}.log", "a")
        procs.append((subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        folders.append(folder)
    try:
        while any(proc.poll() is None for proc, _ in procs):
            if on_progress:
                on_progress(sum(rows_written(f) for f in folders))
            time.sleep(poll_s)
    except KeyboardInterrupt:  # Ctrl-C or the scheduler's SIGTERM: stop the workers the same way
        for proc, log in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # each keeps its rows and writes its table
        for proc, log in procs:
            proc.wait()
            log.close()
        raise
    codes = []
    for proc, log in procs:
        codes.append(proc.wait())
        log.close()
    if on_progress:
        on_progress(sum(rows_written(f) for f in folders))
    if any(c not in (0, 1) for c in codes):
        raise ShardError(f"a GPU worker failed (exit codes {codes}); see {work}/gpu*.log, then rerun to resume")
    return folders


def merge(out: Path, folders: list[Path]) -> results.RunStore:
    """One run folder from several shards of the same scenario file."""
    metas = [results.load(f)[1] for f in folders]
    hashes = {m.get("scenario_sha256") for m in metas}
    if len(hashes) != 1:
        raise ShardError("these run folders ran different scenario files; only shards of one sweep merge")
    text = (Path(folders[0]) / results.SCENARIO).read_text()
    rows, seen = [], {}
    for folder in folders:
        for row in results.read_rows(folder):
            key = tuple(row[k] for k in results.KEY)
            if key in seen:
                raise ShardError(f"point {key} is in both {seen[key]} and {folder}: overlapping shards")
            seen[key] = folder
            rows.append(row)
    per_shard = ("rows", "status_counts", "wall_s", "state", "cuda_visible_devices", "gpu_uuid", "host")
    meta = {k: v for k, v in metas[0].items() if k not in per_shard}
    meta.update(host=", ".join(sorted({str(m.get("host")) for m in metas})), shards=metas,
                merged_from=[str(f) for f in folders], what=f"merge of {len(folders)} shards",
                wall_s=max(m.get("wall_s", 0.0) for m in metas))
    store = results.RunStore.create(out, meta, text)
    for row in rows:
        store.append(row)
    store.finalize(state="complete" if all(m.get("state") == "complete" for m in metas) else "incomplete")
    return store


def submit(child_args: list[str], count: int, out: Path, executor: str = "auto", **slurm) -> list[Path]:
    """A job array of ``count`` shards through submitit (Slurm where there is one; ``local`` runs the
    same path as local processes), then waits for them.  Returns the shards' run folders."""
    import submitit

    work = work_dir(out)
    folder = work / "submitit"
    ex = submitit.LocalExecutor(folder) if executor == "local" else submitit.AutoExecutor(folder)
    if slurm:
        ex.update_parameters(**slurm)
    shards = [work / f"shard{i}" for i in range(count)]
    jobs = ex.map_array(_run_shard, [child_args] * count, range(count), [count] * count, shards)
    codes = [job.result() for job in jobs]
    if any(c not in (0, 1) for c in codes):
        raise ShardError(f"a shard failed (exit codes {codes}); logs are in {folder}")
    return shards


def _run_shard(child_args: list[str], index: int, count: int, folder: Path) -> int:
    """One array task: ``swabench run ... --shard index/count --out folder`` in a fresh process."""
    args = [sys.executable, "-m", "swabench", "run", *child_args, "--shard", f"{index}/{count}",
            "--out", str(folder), *(["--resume"] if (Path(folder) / results.META).exists() else [])]
    return subprocess.run(args).returncode
