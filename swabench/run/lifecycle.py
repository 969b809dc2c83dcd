"""A run's life: open its folder (created or resumed, and locked), record where and how it ran,
prepare the GPU (peaks, JIT warm-up), sweep, finalize, and hand the outcome back as data.

The CLI parses, calls ``execute`` (or ``multigpu.execute``) with a ``Progress`` to draw on, prints,
and exits with ``Outcome.exit_status``; nothing here prints or exits.  torch and pandas are imported
inside the functions, so the ``--gpus`` launcher starts its workers before it imports either.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from swabench import STARTED
from swabench.analysis import derived
from swabench.errors import UserError
from swabench.run import isolation
from swabench.run.signals import interrupt_on_signals
from swabench.inputs import scenarios
from swabench.store import places, run_folder, tables
from swabench.store.run_folder import RunFolderError, RunStore, text_hash

if TYPE_CHECKING:
    import pandas as pd
    import torch

RUNS_ROOT = Path("runs")  # where a run goes without --out: git-ignored, apart from the published runs in results/
WARMUP_JOBS = 8  # JIT modules built at once before a sweep


class Progress(Protocol):
    """What a run tells whoever drives it (the CLI draws it; tests may ignore it)."""

    def note(self, text: str, warn: bool = False) -> None: ...

    def start(self, total: int, label: str) -> None: ...

    def advance(self, rows: int = 1, row: dict | None = None) -> None: ...

    def finish(self) -> None: ...


class Silent:
    def note(self, text, warn=False): pass

    def start(self, total, label): pass

    def advance(self, rows=1, row=None): pass

    def finish(self): pass


@dataclass(frozen=True)
class Request:
    scenario: scenarios.Scenario
    out: Path
    device: torch.device
    timed: bool = True  # False: the gate only (``swabench check``)
    resume: bool = False
    l2: str = "cold"
    sharding: dict | None = None
    meta: dict | None = None  # what this kind of run adds to meta.json (a replay's trace)
    counted: bool = False  # gate, then one call per point for Nsight Compute to count (``measure.counters``)
    # points in a supervised worker process (``run.isolation``); False: in this process
    isolated: bool = field(default_factory=isolation.isolated_by_default)
    retry_crashed: bool = False  # a resume runs the points recorded as crash again
    limits: isolation.Limits = isolation.Limits()

    @property
    def in_worker(self) -> bool:
        """Whether points run in a supervised worker: a counted run stays in the process Nsight Compute launched."""
        return self.isolated and not self.counted

    @property
    def what(self) -> str:
        return "run" if self.timed else "count" if self.counted else "check"


@dataclass
class Outcome:
    folder: Path
    state: str  # complete | skipped (every point skipped) | interrupted | incomplete (a merge that misses shards)
    table: pd.DataFrame
    wall_s: float  # the sweep's, summed over every start of the folder
    total_s: float  # this process's, from importing swabench
    session_s: float | None = None  # this start's sweep, where earlier starts swept too (a resume)
    signal: str | None = None  # the signal that interrupted it, where one did

    def count(self, status: str) -> int:
        return int((self.table["status"] == status).sum()) if len(self.table) else 0

    def messages(self, strict: bool, resume_with: str) -> list[tuple[str, str | None]]:
        """(text, colour) lines that close a sweep: its time, and what to do about what happened."""
        xpass, fail, crash = self.count("xpass"), self.count("fail"), self.count("crash")
        said = f"sweep wall time {self.wall_s:.1f} s ({self.total_s:.1f} s since swabench started)"
        if self.session_s is not None:
            said = (f"sweep wall time {self.session_s:.1f} s in this session ({self.total_s:.1f} s since swabench "
                    f"started), {self.wall_s:.1f} s over every session of this run folder")
        lines = [(said, None)]
        if self.state == "interrupted":
            by = f" by {self.signal}" if self.signal else ""
            return lines + [(f"interrupted{by}: the finished rows are kept in {self.folder}; continue with "
                             f"`{resume_with}`", "yellow")]
        if self.state == "skipped":
            return lines + [(f"{skipping(list(self.table['reason'].fillna('')))}; nothing ran: the rows are kept in "
                             f"{self.folder}, its state skipped", "red")]
        if xpass:
            lines.append((f"{xpass} points of known-bug implementations passed where their mistake should show "
                          f"(xpass): each row's reason says whether the library changed or the gate is blind there",
                          "yellow"))
        if crash:
            lines.append((f"{crash} points crashed (their process died, hung or left the GPU unusable; each row's "
                          f"reason says how): the sweep went on without them, a resume leaves them out unless given "
                          f"--retry-crashed", "red" if crashed_correct(self.table) else "yellow"))
        if fail or (strict and xpass):
            lines.append((f"{fail} points failed the gate" + (f", {xpass} xpass (--strict)" if strict else ""), "red"))
        if self.noise_warning:
            lines.append((self.noise_warning, "yellow"))
        return lines

    @property
    def noise_warning(self) -> str | None:
        """What to say when most of the run's timed points are noisy (analysis.noise), else None."""
        from swabench.analysis import noise

        return noise.warning(self.table)

    def exit_status(self, strict: bool = False) -> int:
        """130 interrupted; 2 when nothing ran (every point skipped); 1 when a correct implementation failed the
        gate (or, strict, a known bug was not caught); else 0."""
        return {"interrupted": 130, "skipped": 2}.get(self.state) or gate_status(self.table, strict)


class NothingToRun(UserError):
    pass


def all_skipped(table: pd.DataFrame) -> bool:
    """Whether the run has rows and every one is a skip: it finished, but nothing ran."""
    return bool(len(table)) and bool((table["status"] == "skip").all())


def skipping(reasons: list[str]) -> str:
    """'every one of 370 points skips here: flashinfer needs CUDA (device is cpu) (330); ... (8); 5 other reasons':
    the two commonest reasons with their counts."""
    counts = Counter(reasons)
    said = "; ".join(f"{why or 'no reason given'} ({n})" for why, n in counts.most_common(2))
    more = len(counts) - 2
    return f"every one of {len(reasons)} points skips here: {said}" + (f"; {more} other reasons" if more > 1 else
                                                                     "; 1 other reason" if more == 1 else "")


def check_runnable(scenario: scenarios.Scenario, device: torch.device) -> None:
    """NothingToRun, before a run folder is made, when the scenario expands to no point, or when every point
    skips on ``device`` for a reason known before any workload is built (the device, the library)."""
    from swabench.impls import registry
    from swabench.run import sweep

    where = scenario.path
    if not scenario.points:
        said = [f"{impl} {why}" for impl, why in scenario.unmodelled.items()]
        why = (f"its [[skip]] rules removed all {len(scenario.skipped)}" if scenario.skipped else
               f"no implementation it lists makes a point of its steps: {'; '.join(said[:3])}"
               + (f"; {len(said) - 3} more" if len(said) > 3 else ""))
        raise NothingToRun(f"{where}: the scenario expands to 0 points ({why}); nothing to run")
    options = sweep.SweepOptions(device=device)
    reasons = [sweep.skip_reason(p, options) for p in scenario.points]
    if not all(reasons):
        return
    on_cpu = device.type == "cpu" and any(registry.get(p.impl).needs_cuda for p in scenario.points)
    advice = ("run on a GPU node, or pick a scenario or --impl with embedded paths (`swabench list`)" if on_cpu else
              "install what they need, or pick other implementations with --impl (`swabench list`)")
    raise NothingToRun(f"{where}: {skipping(reasons)}; {advice}")


def gate_status(table: pd.DataFrame, strict: bool = False) -> int:
    """1 when a correct implementation failed the gate or crashed (or, strict, a known bug was not caught), else 0."""
    statuses = set(table["status"]) if len(table) else set()
    return 1 if "fail" in statuses or crashed_correct(table) or (strict and "xpass" in statuses) else 0


def crashed_correct(table: pd.DataFrame) -> bool:
    """Whether a correct implementation's point crashed (a planted or known-bug path's crash is its own business)."""
    return bool(len(table)) and bool(((table["status"] == "crash") & (table["kind"] == "correct")).any())


def since_start() -> float:
    """Seconds since this process imported swabench (its start-up included), to 0.1 s."""
    return round(time.perf_counter() - STARTED, 1)


def default_out(scenario_name: str, device_type: str, what: str, root: Path = RUNS_ROOT) -> Path:
    """``runs/NAME-WHAT-DEVICE-TIME``, created empty now (with a suffix, -2 ..., when a run started
    in the same second took the name); the name is a slug (scenarios.check_name), so the folder stays
    under the root."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"{scenarios.check_name(scenario_name)}-{what}-{device_type}-{stamp}"
    assert (root / name).resolve().parent == root.resolve(), name
    return places.new_folder(root, name)


def open_store(request: Request) -> RunStore:
    """The run folder, created with its metadata or reopened to resume; RunFolderError before any
    GPU work when it cannot be."""
    from swabench.run import environment, sweep

    s = request.scenario
    if request.resume:
        store = RunStore.resume(request.out, s.text)
        try:
            meta = store.meta()
            if meta.get("selection", selection(request)) != selection(request) or meta.get("what") != request.what:
                held = f" ({meta['selection']})" if meta.get("selection") else ""
                raise RunFolderError(f"{request.out} holds a {meta.get('what') or 'run'} of other points or options"
                                     f"{held}; resume it as it was started: "
                                     f"`{rerun_command(request.out, meta.get('command'))}`")
            tables.refuse_foreign_rows(store.folder / run_folder.ROWS, {p.key for p in s.points})
            store.update_meta(state="running", **(request.meta or {}))
        except BaseException:
            store.close()
            raise
        return store
    places.check_new_run(request.out, hint=places.NOTHING_WRITTEN, resumable=True)  # before collecting
    from swabench.run import patched_release

    meta = {**environment.collect(request.device), "what": request.what, "scenario": s.name,
            "scenario_path": s.path, "implementations": s.implementations, "points": len(s.points),
            "selection": selection(request), "method": sweep.timer_method(sweep_options(request)),
            "sharding": request.sharding, "embedded_backend": request.device.type == "cpu",
            "isolation": {"worker": True, "point_limit_s": request.limits.point_s,
                          "build_limit_s": request.limits.build_s} if request.in_worker else {"worker": False},
            **(request.meta or {})}
    return RunStore.create(request.out, patched_release.label(meta), s.text)


def selection(request: Request) -> dict:
    """What a resume must match: the device, the L2 mode, exactly the points (the scenario's, after --impl, --case
    and --shard), and the patch where one was applied."""
    keys = json.dumps(sorted(p.key for p in request.scenario.points))
    patch = (request.meta or {}).get("patch")
    return {"device": request.device.type, "l2": request.l2 if request.timed or request.counted else None,
            "points_sha256": text_hash(keys), **({"patch_sha256": patch["sha256"]} if patch else {})}


def rerun_command(out: Path, command: str | None = None, resume: bool = True) -> str:
    """The command that continues the run in ``out``: ``command`` (this process's own by default)
    with --resume made explicit and --out naming ``out``, the folder as given now (a copied or moved
    folder's recorded command names where it was)."""
    args = [a for a in (shlex.split(command)[1:] if command else sys.argv[1:]) if not a.startswith("--out=")]
    while "--out" in args:
        at = args.index("--out")
        del args[at:at + 2]
    args += ["--out", str(out)]
    args += ["--resume"] if resume and "--resume" not in args else []
    return "swabench " + shlex.join(args)


def sweep_options(request: Request, unbuildable: dict | None = None):
    from swabench.run import sweep
    from swabench.measure import timing

    return sweep.SweepOptions(device=request.device, timed=request.timed, unbuildable=unbuildable or {},
                              graph_timer=timing.GraphTimerOptions(l2=request.l2), counted=request.counted)


def execute(request: Request, progress: Progress = Silent()) -> Outcome:
    """Sweep every point of the request not yet in its folder.  The folder is finalized whatever
    happens from the moment it is open: interrupted (Ctrl-C, or any signal that would end the process),
    or crashed (recorded as such, and re-raised); a run in which every point skipped is ``skipped``."""
    from swabench.run import sweep

    with interrupt_on_signals() as signals:
        signals.hold()  # a signal while the folder is made is raised once the folder can record it
        # the worker starts first: its imports and CUDA start overlap this process's collecting the environment
        supervisor = isolation.Supervisor(sweep_options(request), request.limits) if request.in_worker else None
        try:
            store = open_store(request)
        except BaseException:
            if supervisor:
                supervisor.close(now=True)
            raise
        s, state, by, started = request.scenario, "complete", None, time.perf_counter()
        earlier_s = store.meta().get("wall_s") or 0.0  # the sweeps of earlier starts of this folder

        def finalize(state: str):
            signals.hold()
            session = time.perf_counter() - started
            replaced = {}
            if supervisor and supervisor.replaced:  # summed over every start of the folder
                held = store.meta().get("isolation", {})
                replaced = {"isolation": {**held, "workers_replaced": held.get("workers_replaced", 0) +
                                          supervisor.replaced}}
            return session, store.finalize(derived.add_derived, state=state, wall_s=round(earlier_s + session, 1),
                                           total_s=since_start(), **replaced)

        try:
            try:
                signals.release()
                if store.lock.took_over:
                    progress.note(f"took over the lock of a process that is gone ({store.lock.took_over})", warn=True)
                if request.device.type == "cpu":
                    progress.note("embedded backend: pure PyTorch on the CPU. Gate results are real; timings are "
                                  "host wall clock of PyTorch code, not GPU kernel times.", warn=True)
                done = store.done(again=("crash",) if request.retry_crashed else ())
                todo = [p for p in s.points if p.key not in done]
                unfinished = [k for k in store.unfinished() if k not in done]
                if unfinished:
                    progress.note(f"an earlier start of this run ended inside {len(unfinished)} point(s) without a "
                                  f"word (the first: {' '.join(map(str, unfinished[0]))}); they run again now",
                                  warn=True)
                if supervisor and not todo:
                    supervisor.close(now=True)
                    supervisor = None
                progress.note(f"{s.name}: {len(s.cases)} cases, {len(s.points)} points, {len(todo)} to "
                              f"{request.what} -> {request.out}")
                if request.device.type == "cpu":  # paths that do in PyTorch what a GPU's kernels do: say how long
                    from swabench.run import cpu_cost

                    progress.note(cpu_cost.estimate(todo, request.device, request.timed).describe(len(todo)))
                unbuildable = prepare_gpu(store, todo, request.device, request.timed, progress, supervisor) \
                    if request.device.type == "cuda" else {}
                if request.counted:
                    from swabench.measure import counters
                    counters.calibrate(request.device)
                if supervisor:
                    supervisor.ready()
                store.update_meta(setup_s=since_start())
                started = time.perf_counter()
                progress.start(len(todo), request.what)
                options = sweep_options(request, unbuildable)
                rows = isolation.run(todo, store, options, s.name, supervisor=supervisor) if supervisor else \
                    sweep.run(todo, store, options, s.name)
                try:
                    for row in rows:
                        progress.advance(1, row)
                finally:
                    progress.finish()
            except KeyboardInterrupt as e:
                state, by = "interrupted", getattr(e, "signal", None)
            except BaseException:
                with contextlib.suppress(OSError, UserError):  # a full disk: the error that ended the run is the news
                    finalize("crashed")
                raise
            session, table = finalize(state)
            if state == "complete" and request.sharding is None and all_skipped(table):
                state = store.update_meta(state="skipped")["state"]
            return Outcome(Path(request.out), state, table, earlier_s + session, since_start(),
                           session if request.resume else None, by)
        finally:
            if supervisor:
                supervisor.close(now=True)
            store.close()


def prepare_gpu(store: RunStore, todo, device: torch.device, timed: bool, progress: Progress,
                supervisor: isolation.Supervisor | None = None) -> dict:
    """Measure the node's peaks (once per run folder) and build every JIT module before timing, in the supervised
    worker where there is one; returns the modules that could not be built (their points skip instead of building
    again, a build that killed its worker among them)."""
    from swabench.measure import peaks
    from swabench.run import sweep

    if timed and "peaks" not in store.meta():
        progress.note("measuring the node's bf16 matmul rate, copy and read bandwidth (its ceiling read from NVML) ...")
        try:
            measured = supervisor.ask(("peaks", device), supervisor.limits.point_s, "measuring the node's peaks") \
                if supervisor else peaks.measure(device)
            store.update_meta(peaks=measured)
        except isolation.WorkerDied as e:  # the points can still run: their rows then lack the floors
            progress.note(f"the node's peaks could not be measured: the worker {e.reason}", warn=True)
    warm = supervisor.warm_up(todo, WARMUP_JOBS) if supervisor else sweep.warm_up(todo, device, jobs=WARMUP_JOBS)
    warmups = store.meta().get("jit_warmups", []) + [warm.describe()]  # one per start of this run folder
    store.update_meta(jit_warmups=warmups,
                      jit_warmup_total_s=round(sum(w.get("jit_warmup_wall_s") or 0.0 for w in warmups), 1))
    progress.note(f"JIT warm-up: {len(warm.seconds)} module signatures in {warm.wall_s:.1f} s"
                  + (f", compiled {len(warm.built)} modules" if warm.built else "")
                  + (f", {len(warm.failed)} could not be built" if warm.failed else ""), warn=bool(warm.failed))
    return warm.failed
