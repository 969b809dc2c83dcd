"""Spreading a sweep: deterministic shards, one worker process per GPU, job arrays across nodes,
and merging the shards' run folders back into one.

A shard is every n-th *case* of the scenario (all of a case's implementations stay together, so
a case's rows share one workload and one GPU).  Each worker writes an ordinary run folder; ``merge``
checks they ran the same scenario file and unions their rows, keeping each row's GPU identity.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from . import results
from .scenarios import Scenario


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


def shard(scenario: Scenario, index: int, count: int) -> Scenario:
    """Keep the points of every count-th case, starting at index (in the scenario's case order)."""
    keep = {case for k, case in enumerate(scenario.cases) if k % count == index}
    scenario.points = [p for p in scenario.points if p.case in keep]
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


def run_on_gpus(child_args: list[str], gpus: list[int], out: Path,
                on_progress: Callable[[int], None] | None = None, poll_s: float = 1.0) -> list[Path]:
    """One ``swabench run`` per GPU, each seeing only its GPU, each on its own shard; returns their
    run folders once all have finished.  ``on_progress(rows)`` hears the rows journaled so far."""
    work = work_dir(out)
    work.mkdir(parents=True, exist_ok=True)
    procs, folders = [], []
    for i, gpu in enumerate(gpus):
        folder = work / f"gpu{gpu}"
        args = [sys.executable, "-m", "swabench", "run", *child_args, "--shard", f"{i}/{len(gpus)}",
                "--out", str(folder), *(["--resume"] if (folder / results.META).exists() else [])]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "SWABENCH_GPU_ID": str(gpu)}
        log = open(work / f"gpu{gpu}.log", "a")
        procs.append((subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        folders.append(folder)
    while any(proc.poll() is None for proc, _ in procs):
        if on_progress:
            on_progress(sum(rows_written(f) for f in folders))
        time.sleep(poll_s)
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
    meta.update(host=", ".join(sorted({str(m.get("host")) for m in metas})), merged_from=[str(f) for f in folders], shards=metas, what=f"merge of {len(folders)} shards",
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
