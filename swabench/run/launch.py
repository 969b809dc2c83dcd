"""Processes for shards: one ``swabench run --shard I/N`` worker per GPU of this node, or a job array
through submitit (Slurm, or local processes) across nodes.

Which points a shard runs, and how shards merge, is ``shards``' business; this module only starts,
watches and stops processes.  It imports neither torch nor pandas, and counts GPUs through NVML
without starting CUDA, so ``swabench run --gpus`` has its workers running a fraction of a second
after it starts (the CLI with torch took 3.9 s to import on the H200 node).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from swabench.errors import RunFailed, UserError
from swabench.store import reading
from swabench.store.places import check_new_run, make_folder
from swabench.store.schema import META, ROWS


class LaunchError(UserError, ValueError):
    pass


def _nvml_device_count() -> int:
    """GPUs on this node per the NVIDIA driver (0 without one), without initializing CUDA."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return 0
    if nvml.nvmlInit_v2() != 0:
        return 0
    try:
        count = ctypes.c_uint(0)
        return count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else 0
    finally:
        nvml.nvmlShutdown()


def visible_gpus() -> list[str]:
    """The GPUs this process may use, each as the ``CUDA_VISIBLE_DEVICES`` entry that shows a worker
    that GPU alone.  Honours this process's own ``CUDA_VISIBLE_DEVICES`` as CUDA does: entries up to
    the first invalid one (indices, or GPU-/MIG- UUIDs)."""
    count = _nvml_device_count()
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return [str(i) for i in range(count)]
    entries = []
    for entry in (e.strip() for e in spec.split(",")):
        if not (entry.startswith(("GPU-", "MIG-")) or (entry.isdigit() and int(entry) < count)):
            break
        entries.append(entry)
    return entries


def choose_gpus(spec: str) -> tuple[list[int], list[str]]:
    """(the chosen indices into the visible GPUs, the visible GPUs) for ``--gpus spec``."""
    visible = visible_gpus()
    if not visible:
        raise LaunchError("--gpus: no CUDA device is visible here (NVML counts none, or CUDA_VISIBLE_DEVICES "
                          "hides them)")
    return parse_gpus(spec, len(visible)), visible


def parse_gpus(spec: str, available: int) -> list[int]:
    """'all' | 'N' (the first N) | '0,2' (these) -> indices into ``visible_gpus()``."""
    if spec == "all":
        gpus = list(range(available))
    elif spec.isdigit():
        gpus = list(range(int(spec)))
    else:
        try:
            gpus = [int(g) for g in spec.split(",")]
        except ValueError:
            raise LaunchError(f"--gpus: expected all, a count or a list like 0,2; got {spec!r}") from None
    if not gpus or len(set(gpus)) != len(gpus) or any(not 0 <= g < available for g in gpus):
        raise LaunchError(f"--gpus {spec}: this node has {available} GPU(s) (0..{available - 1})")
    return gpus


def worker_args(impls=(), cases=(), costs_from=None) -> list[str]:
    """A worker's filters and its --costs-from (absolute: it may run elsewhere)."""
    args = [a for i in impls for a in ("--impl", i)] + [a for c in cases for a in ("--case", c)]
    return args + (["--costs-from", str(Path(costs_from).resolve())] if costs_from else [])


def work_dir(out: Path) -> Path:
    """Where the shards of the merged run ``out`` live (beside it: a run folder holds one run)."""
    return out.with_name(out.name + "-shards")


def rows_written(folder: Path) -> int:
    """Rows a worker has journaled so far (complete lines; a resumed run counts its earlier ones)."""
    try:
        return reading.read_bytes(Path(folder) / ROWS, reading.TABLE).count(b"\n")
    except reading.ReadError:  # none yet
        return 0


def _state(folder: Path) -> str | None:
    """A shard's state as its meta.json records it (None when it wrote none): a worker that exits 1
    may have finished with failed points, or crashed; only the folder tells which."""
    try:
        return reading.json_file(Path(folder) / META, reading.META).get("state")
    except (reading.ReadError, AttributeError):
        return None


def worker_threads(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


def _shard_command(child_args: list[str], index: int, count: int, folder: Path) -> list[str]:
    """``swabench run ... --shard index/count --out folder``, resuming the folder if it holds a run."""
    return [sys.executable, "-m", "swabench", "run", *child_args, "--shard", f"{index}/{count}",
            "--out", str(folder), *(["--resume"] if (Path(folder) / META).exists() else [])]


class Workers:
    """One ``swabench run`` per chosen GPU, each seeing only its GPU, each on its own shard, started
    at construction; ``wait`` returns their run folders.  ``gpus`` index ``visible`` (the launcher's
    ``visible_gpus()``; without it, index I is shown as GPU I).  Each worker's output goes to
    ``gpuI.log`` in the work folder."""

    def __init__(self, child_args: list[str], gpus: list[int], out: Path, visible: list[str] | None = None):
        self.work = work_dir(out)
        self.created_work = not self.work.exists()
        make_folder(self.work)
        # Each worker's CPU ops (page tables, lookups, references) get their share of the cores: with
        # every worker running one thread per core, OpenMP's spinning threads slowed both (as torchrun,
        # unless the caller chose).
        threads = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": str(worker_threads(len(gpus)))}
        self.folders = [self.work / f"gpu{g}" for g in gpus]
        self.started = time.perf_counter()
        self.procs, self.logs, self.ended_s = [], [], [None] * len(gpus)
        try:
            for i, (gpu, folder) in enumerate(zip(gpus, self.folders)):
                device = visible[gpu] if visible is not None else str(gpu)
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": device, "SWABENCH_GPU_ID": device, **threads}
                self.logs.append(open(self.work / f"gpu{gpu}.log", "a"))
                self.procs.append(subprocess.Popen(_shard_command(child_args, i, len(gpus), folder), env=env,
                                                   stdout=self.logs[-1], stderr=subprocess.STDOUT))
        except BaseException:
            self.stop()  # the workers already started must not outlive a launch that failed
            raise

    def rows(self) -> int:
        return sum(rows_written(f) for f in self.folders)

    def _reap(self) -> bool:
        """Note when each worker ended; True while any still runs."""
        for i, proc in enumerate(self.procs):
            if self.ended_s[i] is None and proc.poll() is not None:
                self.ended_s[i] = round(time.perf_counter() - self.started, 1)
        return any(t is None for t in self.ended_s)

    def _close(self) -> list[int]:
        codes = [proc.wait() for proc in self.procs]
        for log in self.logs:
            log.close()
        return codes

    def stop(self) -> None:
        """SIGTERM to every worker still running (each keeps its rows and writes its table), then wait."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        self._close()

    def wait(self, on_progress: Callable[[int], None] | None = None, poll_s: float = 0.25) -> list[Path]:
        """Block until every worker has ended; ``on_progress(rows)`` hears the rows journaled so far.
        Ctrl-C (or any signal that would end the launcher, raised as KeyboardInterrupt) stops the workers the same
        way."""
        try:
            while self._reap():
                if on_progress:
                    on_progress(self.rows())
                time.sleep(poll_s)
        except KeyboardInterrupt:
            self.stop()
            raise
        codes = self._close()
        if on_progress:
            on_progress(self.rows())
        unfinished = [f for f in self.folders if _state(f) != "complete"]
        if any(c not in (0, 1) for c in codes) or unfinished:
            raise RunFailed(f"a GPU worker did not finish (exit codes {codes}); its rows are kept: see "
                            f"{self.work}/gpu*.log, then run the same command again to resume")
        return self.folders


def check_out(out: Path) -> Path:
    """``out`` as the path to write, or RunFolderError unless it can hold the merged run: not a run already, not
    inside one, and its shards' folder beside it can be written (before anything is submitted)."""
    out = check_new_run(out)
    make_folder(work_dir(out))
    return out


def submit(child_args: list[str], count: int, out: Path, executor: str = "auto",
           say: Callable[[str], None] = lambda text: None, **slurm) -> list[Path]:
    """A job array of ``count`` shards through submitit (Slurm where there is one; ``local`` runs the
    same path as local processes, at most one per core at a time), then waits for them, telling ``say`` what it
    submitted and each shard as it ends (the array may queue, or run, for hours).  Returns the shards' run
    folders."""
    try:
        import submitit
    except ImportError:
        raise LaunchError("submit needs submitit: pip install 'swabench[slurm]'") from None
    out = check_out(out)
    work = work_dir(out)
    folder = work / "submitit"
    ex = submitit.LocalExecutor(folder) if executor == "local" else submitit.AutoExecutor(folder)
    if slurm:
        ex.update_parameters(**slurm)
    shards = [work / f"shard{i}" for i in range(count)]
    codes = []
    local = executor == "local" or getattr(ex, "cluster", None) == "local"  # auto without Slurm is local too
    runs = batches(count, local)
    where = f"as local processes, {len(runs[0])} at once" if local else f"to {getattr(ex, 'cluster', 'the scheduler')}"
    say(f"submitting {count} shard(s) through submitit {where}: their run folders in {work}, their logs in {folder}; "
        f"waiting for them")
    for batch in runs:
        jobs = ex.map_array(_run_shard, [child_args] * len(batch), batch, [count] * len(batch),
                            [shards[i] for i in batch])
        for index, job in zip(batch, jobs):
            codes.append(job.result())
            say(f"shard {index}/{count} ended (exit {codes[-1]}, {_state(shards[index]) or 'no run folder'})")
    if any(c not in (0, 1) for c in codes) or any(_state(f) != "complete" for f in shards):
        raise RunFailed(f"a shard did not finish (exit codes {codes}); logs are in {folder}")
    return shards


def batches(count: int, local: bool) -> list[range]:
    """The shard indices submitted together: all of them to a scheduler; local processes at most one
    per core at a time (submitit's LocalExecutor starts every task of an array at once)."""
    at_once = max(1, os.cpu_count() or 1) if local else count
    return [range(start, min(count, start + at_once)) for start in range(0, count, at_once)]


def _run_shard(child_args: list[str], index: int, count: int, folder: Path) -> int:
    """One array task, in a fresh process."""
    return subprocess.run(_shard_command(child_args, index, count, folder)).returncode
