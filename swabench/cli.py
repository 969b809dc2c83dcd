"""The ``swabench`` command line. The only module that prints.

Modules that import torch, pandas or matplotlib are imported inside the commands that use them:
``swabench --help`` answers at once, and ``run --gpus`` starts its workers before it imports torch
itself (the CLI with torch took 3.9 s to import on the H200 node; every worker pays that anyway)."""

from __future__ import annotations

import contextlib
import datetime
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import click

from . import STARTED, __version__, launch, results, scenarios
from .results import RunFolderError, RunStore

if TYPE_CHECKING:
    import torch


class InputError(click.ClickException):
    """Bad input from the user: said plainly, exit status 2, nothing written."""

    exit_code = 2


def resolve_device(choice: str, what: str = "--device cuda") -> torch.device:
    import torch

    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise InputError(f"{what}: no CUDA device is visible here (torch.cuda.is_available() is False)"
                         + ("; use --device cpu or auto" if what == "--device cuda" else ""))
    return torch.device(choice)


def scenario_path(name: str | None, device_type: str) -> Path:
    """The scenario file to run: NAME's, or the default for this device."""
    if name is None:
        name = "default" if device_type == "cuda" else "cpu"
        click.echo(f"no scenario given: running {name}.toml"
                   + (" (the embedded CPU default: no GPU here)" if name == "cpu" else ""), err=True)
    try:
        return scenarios.find(name)
    except scenarios.ScenarioError as e:
        raise InputError(str(e)) from None


def load_scenario(name: str | Path | None, impls: tuple[str, ...], device_type: str) -> scenarios.Scenario:
    path = name if isinstance(name, Path) else scenario_path(name, device_type)
    try:
        return scenarios.load(path, impl_filter=impls or None)
    except scenarios.ScenarioError as e:
        raise InputError(str(e)) from None


def default_out(scenario_name: str, device_type: str, what: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("results") / f"{scenario_name}-{what}-{device_type}-{stamp}"


device_option = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                             show_default=True, help="Where to run; auto picks CUDA when it is there.")
strict_option = click.option("--strict", is_flag=True,
                             help="Also exit 1 when a known bug is not caught (xpass), e.g. in CI.")
WARMUP_JOBS = 8  # JIT modules built at once before a sweep
l2_option = click.option("--l2", type=click.Choice(["cold", "warm"]), default="cold", show_default=True,
                         help="GPU timing: flush L2 before every call (flush not counted), or back-to-back calls.")
case_option = click.option("--case", "cases", multiple=True, metavar="ID|TEXT",
                           help="Only cases whose id starts with, or whose label contains, this (repeatable).")
costs_option = click.option("--costs-from", "costs_from", type=click.Path(exists=True, file_okay=False),
                            metavar="RUN_DIR", help="Balance the shards by each point's time in this earlier run.")
impl_option = click.option("--impl", "impls", multiple=True, metavar="NAME",
                           help="Only these implementations of the scenario (repeatable).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="swabench")
def main():
    """Correctness-gated benchmarks of sliding-window attention on FlashInfer."""


def select_cases(scenario: scenarios.Scenario, cases: tuple[str, ...]) -> scenarios.Scenario:
    """Keep the points whose case id starts with, or whose label contains, one of ``cases``."""
    if not cases:
        return scenario
    keep = [p for p in scenario.points
            if any(p.case.case_id.startswith(c) or c in p.case.label for c in cases)]
    if not keep:
        raise InputError(f"--case: no case of {scenario.name} matches {', '.join(cases)} "
                         f"(give a case_id prefix or part of a label, see `swabench show`)")
    scenario.points = keep
    return scenario


def _sweep(scenario_name, out, device_choice, impls, resume, timed: bool, strict: bool,
           cases: tuple[str, ...] = (), l2: str = "cold", shard: str | None = None, costs_from=None):
    from . import environment, shards, sweep, timing

    device = resolve_device(device_choice)
    scenario = select_cases(load_scenario(scenario_name, impls, device.type), cases)
    sharding = None
    if shard:
        try:
            index, count = shards.parse_shard(shard)
            scenario = shards.shard(scenario, index, count, _costs(costs_from))
        except shards.ShardError as e:
            raise InputError(str(e)) from None
        sharding = {"index": index, "count": count, "cases": len(scenario.cases),
                    "costs": f"measured in {costs_from}" if costs_from else
                    f"estimated ({shards.POINT_S} s a point, {shards.COMPILE_S} s a per-process compiled kernel)"}
    what = "run" if timed else "check"
    if resume and out is None:
        raise InputError("--resume needs --out DIR: the run folder to continue")
    out = Path(out) if out else default_out(scenario.name, device.type, what)
    options = sweep.SweepOptions(device=device, timed=timed, graph_timer=timing.GraphTimerOptions(l2=l2))
    try:
        if resume:
            store = RunStore.resume(out, scenario.text)
        else:
            meta = {**environment.collect(device), "what": what, "scenario": scenario.name,
                    "scenario_path": scenario.path, "implementations": scenario.implementations,
                    "method": sweep.timer_method(options), "sharding": sharding,
                    "embedded_backend": device.type == "cpu"}
            store = RunStore.create(out, meta, scenario.text)
    except RunFolderError as e:
        raise InputError(str(e)) from None
    if device.type == "cpu":
        click.secho("embedded backend: pure PyTorch on the CPU. Gate results are real; timings are host "
                    "wall clock of PyTorch code, not GPU kernel times.", fg="yellow", err=True)
    done = store.done()
    todo = [p for p in scenario.points if p.key not in done]
    click.echo(f"{scenario.name}: {len(scenario.cases)} cases, {len(scenario.points)} points, "
               f"{len(todo)} to {what} -> {out}", err=True)
    if device.type == "cuda":
        _prepare_gpu(store, todo, device, timed)
    store.write_meta({**store.meta(), "setup_s": _since_start()})
    state, started = "complete", time.perf_counter()
    try:
        with _sigterm_as_ctrl_c(), click.progressbar(
                length=len(todo), label=what, file=sys.stderr, show_pos=True,
                item_show_func=lambda r: r and f"{r['impl']} {r['status']}") as bar:
            for row in sweep.run(scenario, store, options):
                bar.update(1, row)
    except KeyboardInterrupt:
        state = "interrupted"
    except BaseException:
        store.finalize(state="crashed", wall_s=round(time.perf_counter() - started, 1))
        raise
    wall = store.meta().get("wall_s", 0.0) + time.perf_counter() - started
    total = _since_start()
    table = store.finalize(state=state, wall_s=round(wall, 1), total_s=total)
    _summary(table, out)
    click.echo(f"sweep wall time {wall:.1f} s ({total:.1f} s since swabench started)", err=True)
    if state == "interrupted":
        click.secho(f"interrupted: {len(table)} rows kept in {out}; continue with "
                    f"`swabench {what} {scenario.path} --out {out} --resume`", fg="yellow", err=True)
        sys.exit(130)
    failed = int((table["status"] == "fail").sum()) if len(table) else 0
    xpassed = int((table["status"] == "xpass").sum()) if len(table) else 0
    if xpassed:
        click.secho(f"{xpassed} points of known-bug implementations passed where the bug should show (xpass): "
                    f"a finding to look at (fixed upstream, or the case does not exercise it)", fg="yellow", err=True)
    if failed or (strict and xpassed):
        click.secho(f"{failed} points failed the gate" + (f", {xpassed} xpass (--strict)" if strict else ""),
                    fg="red", err=True)
        sys.exit(1)


def _since_start() -> float:
    """Seconds since this process imported swabench (its start-up included), to 0.1 s."""
    return round(time.perf_counter() - STARTED, 1)


@contextlib.contextmanager
def _sigterm_as_ctrl_c():
    """A scheduler's SIGTERM (Slurm, timeout) ends what runs inside like Ctrl-C: rows kept, resumable."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _prepare_gpu(store: RunStore, todo, device: torch.device, timed: bool) -> None:
    """Measure the node's peaks (once per run folder) and build every JIT module before timing."""
    from . import peaks, sweep

    meta = store.meta()
    if timed and "peaks" not in meta:
        click.echo("measuring the node's bf16 matmul rate and copy bandwidth ...", err=True)
        meta["peaks"] = peaks.measure(device)
    warm = sweep.warm_up(todo, device, jobs=WARMUP_JOBS)
    meta.setdefault("jit_warmups", []).append(warm.describe())  # one per start of this run folder
    meta["jit_warmup_total_s"] = round(sum(w["jit_warmup_wall_s"] for w in meta["jit_warmups"]), 1)
    store.write_meta(meta)
    click.echo(f"JIT warm-up: {len(warm.seconds)} module signatures in {warm.wall_s:.1f} s"
               + (f", compiled {len(warm.built)} FlashInfer modules" if warm.built else ""), err=True)


def _summary(table, out: Path) -> None:
    if not len(table):
        click.echo("no rows")
        return
    click.echo(f"\nresults: {out}")
    counts = table.groupby("impl", sort=False)["status"].value_counts().unstack(fill_value=0)
    if "median_us" in table:
        counts["median of medians (us)"] = table.groupby("impl", sort=False)["median_us"].median().round(1)
    click.echo(counts.to_string())
    for status, colour in (("fail", "red"), ("xpass", "yellow")):
        rows = table[table["status"] == status]
        for _, r in rows.head(10).iterrows():
            click.secho(f"  {status.upper()} {r['impl']} [{r['backend']}] {r['case']}: {r['reason']}", fg=colour)
        if len(rows) > 10:
            click.secho(f"  ... and {len(rows) - 10} more {status} rows (results.csv has them all)", fg=colour)


@main.command()
@click.argument("scenario", required=False)
@click.option("--out", type=click.Path(file_okay=False), help="Run folder (default: results/NAME-run-DEVICE-TIME).")
@device_option
@impl_option
@case_option
@click.option("--resume", is_flag=True, help="Continue the run in --out, skipping the points it already has.")
@strict_option
@l2_option
@click.option("--shard", metavar="I/N", help="Only shard I of N (for several nodes; merge after).")
@click.option("--gpus", metavar="all|N|0,2", help="One worker per GPU on this node, each on its own shard, merged into --out.")
@costs_option
def run(scenario, out, device, impls, cases, resume, strict, l2, shard, gpus, costs_from):
    """Gate and time every point of SCENARIO (a file, or a name in scenarios/).

    Without SCENARIO: default.toml on a GPU, cpu.toml (the embedded backend) elsewhere.
    Exit status 1 when a correct implementation fails the gate."""
    if gpus:
        _run_on_gpus(scenario, out, impls, cases, l2, gpus, costs_from)
        return
    if costs_from and not shard:
        raise InputError("--costs-from balances shards: use it with --shard or --gpus")
    _sweep(scenario, out, device, impls, resume, timed=True, strict=strict, cases=cases, l2=l2, shard=shard,
           costs_from=costs_from)


def _costs(costs_from) -> dict | None:
    """Per-point seconds from an earlier run folder, or None (estimate)."""
    from . import shards

    if not costs_from:
        return None
    try:
        return shards.point_costs(costs_from)
    except RunFolderError as e:
        raise InputError(f"--costs-from: {e}") from None
    except shards.ShardError as e:
        raise InputError(str(e)) from None


def _costs_args(costs_from) -> list[str]:
    """The workers' --costs-from (absolute: they may run elsewhere)."""
    return ["--costs-from", str(Path(costs_from).resolve())] if costs_from else []


def _filters(impls, cases) -> list[str]:
    return [a for i in impls for a in ("--impl", i)] + [a for c in cases for a in ("--case", c)]


def _merge_into(out: Path, folders) -> RunStore:
    from . import environment, shards

    try:
        store, table = shards.merge(out, folders)
    except (shards.ShardError, RunFolderError) as e:
        raise InputError(str(e)) from None
    meta = store.meta()
    meta["command"] = environment.collect_command()  # the launch or merge, not shard 0's own command
    store.write_meta(meta)
    _summary(table, out)
    return store


def _run_on_gpus(scenario_name, out, impls, cases, l2, gpus, costs_from=None) -> None:
    """Workers first, then the full check: the launcher counts GPUs through NVML, starts CUDA nowhere,
    and imports torch only once the workers are starting.  Each worker checks the same input before
    any GPU work; input the launcher rejects stops them all, and nothing is kept."""
    visible = launch.visible_gpus()
    if not visible:
        raise InputError("--gpus: no CUDA device is visible here (NVML counts none, or CUDA_VISIBLE_DEVICES "
                         "hides them)")
    try:
        chosen = launch.parse_gpus(gpus, len(visible))
    except launch.LaunchError as e:
        raise InputError(str(e)) from None
    path = scenario_path(scenario_name, "cuda")
    if not out:
        try:
            out = default_out(scenarios.declared_name(scenarios.read(path)[0], path), "cuda", "run")
        except scenarios.ScenarioError as e:
            raise InputError(str(e)) from None
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} already holds a run; choose another --out (the shards resume on their own)")
    child_args = [str(path), "--device", "cuda", "--l2", l2, *_filters(impls, cases), *_costs_args(costs_from)]
    workers = launch.Workers(child_args, chosen, out, visible)
    spawned_s = _since_start()
    try:
        scenario = select_cases(load_scenario(path, impls, "cuda"), cases)
        _costs(costs_from)
    except BaseException:
        workers.stop()
        if workers.created_work:
            shutil.rmtree(workers.work)
        raise
    click.echo(f"{scenario.name}: {len(scenario.points)} points over GPUs {chosen}; shards in {workers.work}", err=True)
    try:
        with _sigterm_as_ctrl_c(), click.progressbar(
                length=len(scenario.points), label=f"run on {len(chosen)} GPUs", file=sys.stderr,
                show_pos=True) as bar:
            folders = workers.wait(on_progress=lambda rows: bar.update(rows - bar.pos))
    except KeyboardInterrupt:
        click.secho(f"interrupted: each GPU's rows are kept in {workers.work}; run the same command "
                    f"again to finish them and merge", fg="yellow", err=True)
        sys.exit(130)
    except launch.LaunchError as e:
        raise click.ClickException(str(e)) from None
    merging = time.perf_counter()
    store = _merge_into(out, folders)
    meta = store.meta()
    meta.update(launch_spawned_s=spawned_s,  # from swabench's start to the workers' start
                launch_worker_end_s=workers.ended_s,  # from the workers' start to each one's exit
                launch_merge_s=round(time.perf_counter() - merging, 1),
                launch_wall_s=round(time.perf_counter() - workers.started, 1),  # workers' start to merged folder
                total_s=_since_start())  # the launcher's own start too: compare with a one-GPU run's total_s
    store.write_meta(meta)
    click.echo(f"{len(chosen)} GPUs: wall time {meta['launch_wall_s']:.1f} s ({meta['total_s']:.1f} s since swabench "
               f"started)", err=True)


@main.command()
@click.argument("scenario")
@click.option("--out", type=click.Path(file_okay=False), help="Run folder (default: results/NAME-check-DEVICE-TIME).")
@device_option
@impl_option
@case_option
@click.option("--resume", is_flag=True, help="Continue the check in --out.")
@strict_option
def check(scenario, out, device, impls, cases, resume, strict):
    """Run the correctness gate only (no timing): a correctness matrix of case x implementation."""
    _sweep(scenario, out, device, impls, resume, timed=False, strict=strict, cases=cases)


@main.command("list")
def list_cmd():
    """Scenario files and implementations."""
    import torch

    from .impls import registry

    click.echo("scenarios:")
    for d in scenarios.scenario_dirs():
        for path in sorted(d.glob("*.toml")) if d.is_dir() else []:
            try:
                s = scenarios.load(path)
                click.echo(f"  {s.name:10s} {len(s.points):5d} points  {s.description}")
            except scenarios.ScenarioError as e:
                click.secho(f"  {path.stem:10s} invalid: {e}", fg="red")
    click.echo("\nimplementations:")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for impl in registry.all_implementations():
        here = impl.availability(device)
        click.echo(f"  {impl.name:22s} {impl.kind:9s} {impl.library:10s} {'/'.join(impl.storages):12s} "
                   f"{impl.summary}" + (f"  [not here: {here}]" if here else ""))


@main.command()
@click.argument("scenario")
@impl_option
def show(scenario, impls):
    """What SCENARIO expands to: cases, implementations, axes, skips."""
    from .impls import registry

    s = load_scenario(scenario, impls, "cpu")
    click.echo(f"{s.name}: {s.description}\nfile: {s.path}")
    click.echo(f"{len(s.cases)} cases, {len(s.points)} points (case x implementation x backend)")
    per_impl = Counter(p.impl for p in s.points)
    for name in s.implementations:
        impl = registry.get(name)
        backends = sorted({p.backend for p in s.points if p.impl == name})
        click.echo(f"  {name:22s} {impl.kind:9s} {per_impl[name]:5d} points  backends: {', '.join(backends) or '-'}")
    click.echo("axes:")
    for axis, values in _axis_values(s.cases).items():
        click.echo(f"  {axis:14s} {', '.join(map(str, values))}")
    if s.skipped:
        click.echo(f"skipped by the scenario's rules: {len(s.skipped)} points")
        for reason, n in Counter(s.skipped).most_common():
            click.echo(f"  {n:5d}  {reason}")


def _axis_values(cases) -> dict:
    out = {}
    for case in cases:
        for k, v in case.axes().items():
            if v is not None and v not in out.setdefault(k, []):
                out[k].append(v)
    return out


@main.command()
@click.argument("out", type=click.Path(file_okay=False))
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
def merge(out, folders):
    """Merge run folders of the same scenario (shards from several GPUs or nodes) into OUT."""
    _merge_into(Path(out), [Path(f) for f in folders])


@main.command()
@click.argument("scenario")
@click.option("--shards", "count", type=click.IntRange(1), required=True, help="How many array tasks.")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="The merged run folder.")
@click.option("--executor", type=click.Choice(["auto", "local"]), default="auto", show_default=True,
              help="auto: Slurm where sbatch exists, else local processes (submitit).")
@click.option("--partition", help="Slurm partition.")
@click.option("--time-min", type=int, default=60, show_default=True, help="Slurm time limit per task, minutes.")
@impl_option
@case_option
@l2_option
@costs_option
def submit(scenario, count, out, executor, partition, time_min, impls, cases, l2, costs_from):
    """Spread SCENARIO over a job array (submitit: Slurm, or local processes), wait, merge into --out."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise InputError("submit needs submitit: pip install 'swabench[slurm]'") from None
    s = select_cases(load_scenario(scenario, impls, "cpu"), cases)  # validate before submitting
    _costs(costs_from)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} already holds a run; choose another --out")
    slurm = {"timeout_min": time_min, "gpus_per_node": 1} if executor == "auto" else {}
    if partition:
        slurm["slurm_partition"] = partition
    try:
        child_args = [s.path, "--l2", l2, *_filters(impls, cases), *_costs_args(costs_from)]
        folders = launch.submit(child_args, count, out, executor, **slurm)
    except launch.LaunchError as e:
        raise click.ClickException(str(e)) from None
    _merge_into(out, folders)


@main.command()
@click.argument("scenario")
@click.option("--jobs", type=click.IntRange(1), default=WARMUP_JOBS, show_default=True, help="Modules built at once.")
@impl_option
def warmup(scenario, jobs, impls):
    """Build every FlashInfer JIT module SCENARIO needs (in parallel) and say what it built and how long
    it took; `swabench run` does the same before timing, so no compile lands in a timed region."""
    from . import sweep

    device = resolve_device("cuda", "warmup")
    s = load_scenario(scenario, impls, device.type)
    warm = sweep.warm_up(s.points, device, jobs)
    for label, seconds in sorted(warm.seconds.items(), key=lambda kv: -kv[1]):
        click.echo(f"{seconds:8.1f} s  {label}")
    click.echo(f"JIT cache: {warm.cache_dir}")
    click.echo(f"compiled {len(warm.built)} FlashInfer module(s)" + "".join(f"\n  {m}" for m in warm.built))
    click.echo(f"{len(warm.seconds)} module signatures: {warm.wall_s:.1f} s wall with {jobs} at once "
               f"(their times add up to {sum(warm.seconds.values()):.1f} s)")


@main.command("compare")
@click.argument("base", type=click.Path(exists=True, file_okay=False))
@click.argument("new", type=click.Path(exists=True, file_okay=False))
@click.option("--threshold", type=float, default=0.05, show_default=True,
              help="Smallest relative change of the median that counts (0.05 = 5%).")
@click.option("--alpha", type=float, default=0.01, show_default=True, help="Significance level of the U test.")
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.option("--allow-different-gpus", is_flag=True, help="Compare runs made on different devices anyway.")
def compare_cmd(base, new, threshold, alpha, fmt, allow_different_gpus):
    """Point-by-point timing comparison of two run folders; exit 1 on a significant regression."""
    from . import compare

    try:
        table, bm, nm = compare.compare(base, new, threshold, alpha, allow_different_gpus)
    except (compare.CompareError, results.RunFolderError) as e:
        raise InputError(str(e)) from None
    click.echo(compare.to_json(table) if fmt == "json" else compare.to_markdown(table, bm, nm, threshold, alpha))
    if (table["verdict"] == "regression").any():
        sys.exit(1)


def _load_run(run_dir):
    try:
        return results.load(run_dir)
    except results.RunFolderError as e:
        raise InputError(str(e)) from None


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(file_okay=False), help="Folder for the figures (default: plots/RUN_NAME).")
def plot(run_dir, out):
    """Figures of a run folder, PNG and SVG."""
    from . import plots

    table, meta = _load_run(run_dir)
    out = Path(out) if out else Path("plots") / Path(run_dir).resolve().name
    for name, paths in plots.make_all(table, meta, out).items():
        click.echo(f"{name:18s} " + (", ".join(map(str, paths)) if paths else "(no points for it in this run)"))


@main.command("report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(file_okay=False), help="Folder for REPORT.md and figures (default: plots/RUN_NAME).")
def report_cmd(run_dir, out):
    """One Markdown report (environment, method, correctness matrix, headline, figures) for a pull request."""
    from . import report

    _load_run(run_dir)
    out = Path(out) if out else Path("plots") / Path(run_dir).resolve().name
    click.echo(report.write(run_dir, out))


@main.command("bench-host")
@click.option("--out", type=click.Path(file_okay=False), help="Run folder (default: results/host-bench-TIME).")
@click.option("--quick", is_flag=True, help="Small batches and contexts only (seconds, for a smoke test).")
def bench_host(out, quick):
    """pytest-benchmark of the host work a step pays (mask build and packing, trimmed page tables,
    indptr arrays), saved as JSON in a run folder and plotted beside it."""
    from . import environment, plots

    bench_dir = environment.REPO / "benchmarks"
    if not bench_dir.is_dir():
        raise InputError(f"{bench_dir} is not there: run from a checkout (pip install -e .)")
    out = Path(out) if out else Path("results") / f"host-bench-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} already holds files; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    meta = {**environment.collect("cpu"), "what": "host benchmarks", "scenario": "host work"}
    results.atomic_write(out / results.META, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    env = {**os.environ, "SWABENCH_BENCH_QUICK": "1" if quick else "0"}
    code = subprocess.run([sys.executable, "-m", "pytest", str(bench_dir), "-q", "-p", "no:cacheprovider",
                           f"--benchmark-json={out / 'host_benchmarks.json'}"], env=env).returncode
    if code != 0:
        raise click.ClickException(f"the benchmarks failed (pytest exit {code})")
    raw = out / "host_benchmarks.json"
    data = json.loads(raw.read_text())
    with gzip.open(out / "host_benchmarks.json.gz", "wt") as f:  # every round is kept: compress it
        json.dump(data, f)
    raw.unlink()
    for path in plots.save(plots.host_work(data, meta), out, "host_work"):
        click.echo(path)


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
def summary(run_dir):
    """Markdown summary of a run folder: the correctness matrix, and the timings if it has any."""
    from . import report

    table, meta = _load_run(run_dir)
    click.echo(report.correctness_summary(table, meta))
    timings = report.timing_summary(table, meta)
    if timings:
        click.echo("\n" + timings)


@main.command()
@click.argument("scenario")
@click.option("--out", type=click.Path(file_okay=False), help="Run folder (default: results/NAME-profile-cuda-TIME).")
@impl_option
@case_option
@click.option("--tool", type=click.Choice(["nsys", "torch"]), default="nsys", show_default=True,
              help="nsys: re-run under Nsight Systems; torch: torch.profiler in this process.")
@l2_option
def profile(scenario, out, impls, cases, tool, l2):
    """Run SCENARIO under a profiler; tie the kernels it saw to each row of the run folder."""
    from . import profiling

    device = resolve_device("cuda", "profile")
    s = select_cases(load_scenario(scenario, impls, device.type), cases)
    out = Path(out) if out else default_out(s.name, device.type, "profile")
    filters = _filters(impls, cases)
    if tool == "torch":
        _torch_profile(s, out, impls, cases, l2)
        return
    if shutil.which("nsys") is None:
        raise InputError("--tool nsys: nsys is not on PATH; install Nsight Systems or use --tool torch")
    report = out.with_name(out.name + ".nsys")  # beside the run folder until the run is written
    child = ["run", s.path, "--out", str(out), "--device", "cuda", "--l2", l2, *filters]
    code = subprocess.run(profiling.nsys_command(str(report), child)).returncode
    if code not in (0, 1) or not (out / results.META).exists():
        raise click.ClickException(f"the profiled run failed (exit {code})")
    rep = report.with_name(report.name + ".nsys-rep")
    rep.rename(out / "profile.nsys-rep")
    sqlite = profiling.nsys_export_sqlite(out / "profile.nsys-rep")
    stats = profiling.nsys_kernel_table(sqlite, results.load(out)[0])
    results.atomic_write(out / "nsys_stats.csv", stats.to_csv(index=False))
    click.echo(stats.to_string(index=False) if len(stats) else "no timed points to attribute")
    click.echo(f"nsys report, sqlite export and nsys_stats.csv are in {out}")


def _torch_profile(s, out: Path, impls, cases, l2) -> None:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        try:
            _sweep(s.path, str(out), "cuda", impls, False, timed=True, strict=False, cases=cases, l2=l2)
        except SystemExit as e:
            if e.code not in (0, 1, None):
                raise
    prof.export_chrome_trace(str(out / "torch_trace.json"))
    text = prof.key_averages().table(sort_by="device_time_total", row_limit=40)
    results.atomic_write(out / "torch_stats.txt", text + "\n")
    click.echo(text)
    click.echo(f"Chrome/Perfetto trace and torch_stats.txt are in {out}")


@main.command()
@click.option("--peaks", "measure_peaks", is_flag=True,
              help="Also measure the node's bf16 matmul rate and copy bandwidth (needs CUDA).")
def env(measure_peaks):
    """What is installed and usable here: GPU, CUDA, torch, flashinfer, nsys."""
    import torch

    from . import environment, peaks
    from .impls import registry

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if measure_peaks and device.type != "cuda":
        raise InputError("--peaks: no CUDA device here; peaks are GPU measurements")
    info = environment.collect(device)
    if measure_peaks:
        info.update({f"peak.{k}": v for k, v in peaks.measure(device).items()})
    for k, v in info.items():
        click.echo(f"{k:28s} {v}")
    usable = [i.name for i in registry.all_implementations() if not i.availability(device)]
    click.echo(f"{'implementations usable here':28s} {', '.join(usable)}")


if __name__ == "__main__":  # pragma: no cover
    main()
