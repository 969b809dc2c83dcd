"""The ``swabench`` command line: parse, call the library, print, exit.  The only module that prints.

Exit status: 0 done, 1 a correct implementation failed the gate (or a regression in ``compare``),
2 bad input (nothing written), 130 interrupted.  Modules that import torch, pandas or matplotlib are
imported inside the commands that use them, so ``--help`` answers at once and ``run --gpus`` starts
its workers before it imports torch."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from swabench.analysis import derived
from swabench import __version__
from swabench.run import launch, lifecycle as runs, shards
from swabench.spec import scenarios
from swabench.cli.options import (Bar, InputError, Main, case_option, costs_option, device_of, impl_option, l2_option,
                      model_option, opt, out_option, run_dir, run_options)


def scenario_file(name: str | None, device_type: str) -> Path:
    default = "default" if device_type == "cuda" else "cpu"
    if name is None:
        click.echo(f"no scenario given: running {default}.toml" + " (the embedded CPU default: no GPU here)"
                   * (default == "cpu"), err=True)
    return scenarios.find(name or default)


def model_scenario(scenario, model, device_type: str) -> str | None:
    """--model NAME without SCENARIO: the shipped template for this device (models.toml on a GPU,
    models-cpu.toml without one); the name is checked here, before any work."""
    if not model:
        return scenario
    from swabench.spec import models
    if model not in models.MODELS:
        raise InputError(f"--model: unknown model {model!r}; known: {', '.join(models.MODELS)}")
    return scenario or ("models" if device_type == "cuda" else "models-cpu")


def load(name, impls=(), cases=(), device_type="cpu", model=None) -> scenarios.Scenario:
    path = name if isinstance(name, Path) else scenario_file(name, device_type)
    s = scenarios.load(path, impl_filter=impls or None)
    return scenarios.select(scenarios.select_model(s, model), cases)


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="swabench")
def main():
    """Correctness-gated benchmarks of sliding-window attention on FlashInfer."""


def sweep_command(scenario, out, device, impls, cases, resume, strict, timed, l2="cold", shard=None, costs_from=None,
                  model=None):
    device = device_of(device)
    s = load(model_scenario(scenario, model, device.type), impls, cases, device.type, model)
    sharding = shards.select_shard(s, shard, costs_from) if shard else None
    if resume and out is None:
        raise InputError("--resume needs --out DIR: the run folder to continue")
    out = Path(out) if out else runs.default_out(s.name, device.type, "run" if timed else "check")
    outcome = runs.execute(runs.Request(s, out, device, timed, resume, l2, sharding), Bar())
    report_outcome(outcome, strict, runs.rerun_command(out))


def report_outcome(outcome: runs.Outcome, strict: bool, resume_with: str) -> None:
    summary(outcome.table, outcome.folder)
    for text, colour in outcome.messages(strict, resume_with):
        click.secho(text, fg=colour, err=True)
    sys.exit(outcome.exit_status(strict))


def summary(table, out: Path) -> None:
    from swabench.publish.markdown import console_summary

    colours = {"  FAIL": "red", "  XPASS": "yellow"}
    click.echo(f"\nresults: {out}" if len(table) else "no rows")
    for line in console_summary(table).splitlines():
        click.secho(line, fg=next((c for k, c in colours.items() if line.startswith(k)), None))


@main.command()
@click.argument("scenario", required=False)
@run_options
@l2_option
@opt("--shard", metavar="I/N", help="Only shard I of N (for several nodes; merge after).")
@opt("--gpus", metavar="all|N|0,2", help="One worker per GPU on this node, each on its own shard, merged into --out.")
@costs_option
def run(scenario, out, device, impls, cases, model, resume, strict, l2, shard, gpus, costs_from):
    """Gate and time every point of SCENARIO (a file, or a scenario name: see `swabench list`).

    Without SCENARIO: default.toml on a GPU, cpu.toml (the embedded backend) elsewhere."""
    if gpus and (shard or resume or device == "cpu"):
        raise InputError("--gpus shards, and resumes, on its own GPUs: drop --shard, --resume and --device cpu "
                         "(run the same command again to continue a launch)")
    if gpus:
        return run_on_gpus(model_scenario(scenario, model, "cuda"), out, impls, cases, l2, gpus, costs_from, strict,
                           model)
    if costs_from and not shard:
        raise InputError("--costs-from balances shards: use it with --shard or --gpus")
    sweep_command(scenario, out, device, impls, cases, resume, strict, True, l2, shard, costs_from, model)


def run_on_gpus(scenario, out, impls, cases, l2, gpus, costs_from, strict, model=None) -> None:
    chosen, visible = launch.choose_gpus(gpus)
    path = scenario_file(scenario, "cuda")
    out = Path(out) if out else runs.default_out(scenarios.declared_name(scenarios.read(path)[0], path), "cuda", "run")

    def validate():
        shards.point_costs(costs_from)
        return load(path, impls, cases, "cuda", model)

    args = ["--l2", l2, *launch.worker_args(impls, cases, costs_from), *(["--model", model] if model else [])]
    outcome = runs.execute_on_gpus(runs.GpuLaunch(path, out, chosen, visible, args, validate), Bar())
    report_outcome(outcome, strict, runs.rerun_command(out, resume=False))


@main.command()
@click.argument("scenario", required=False)
@run_options
def check(scenario, out, device, impls, cases, model, resume, strict):
    """Run the correctness gate only (no timing): a correctness matrix of case x implementation."""
    if not scenario and not model:
        raise InputError("check needs SCENARIO or --model NAME")
    sweep_command(scenario, out, device, impls, cases, resume, strict, timed=False, model=model)


@main.command("list")
def list_cmd():
    """Scenario files and implementations."""
    from swabench.impls import registry

    click.echo("scenarios:\n" + scenarios.listing() + "\n\nimplementations:\n" + registry.listing(device_of("auto")))


@main.command()
@click.argument("scenario", required=False)
@impl_option
@model_option
@opt("--device", type=click.Choice(["cpu", "cuda"]), default="cuda", show_default=True,
     help="With --model and no SCENARIO: which device's template to show.")
@opt("--cases", "each", is_flag=True, help="Also list every case with its memory estimate.")
def show(scenario, impls, model, device, each):
    """What SCENARIO expands to: cases, implementations, axes, skips, memory."""
    if not scenario and not model:
        raise InputError("show needs SCENARIO or --model NAME")
    click.echo(scenarios.describe(load(model_scenario(scenario, model, device), impls, model=model), each))


@main.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@impl_option
@opt("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
     help="Where to run; auto picks CUDA when it is there.")
@out_option
@opt("--resume", is_flag=True, help="Continue the replay in --out, skipping the points it already has.")
@opt("--backend", "backends", multiple=True, type=click.Choice(["fa2", "fa3"]), default=("fa2", "fa3"),
     show_default=True, help="FlashInfer backends each step runs through (repeatable).")
@l2_option
def replay(trace, impls, device, out, resume, backends, l2):
    """Gate and time every distinct step of TRACE once, weighted by how often it occurs: attention
    time per 1000 steps of that mix, per implementation.  TRACE is JSON Lines, one serving step a line:
    {"mode": "decode", "model": "gpt-oss-120b", "requests": [[PREFIX, QUERIES], ...], "count": N}
    (mode extend, verify or decode; the layer a model preset or its shape axes; count optional)."""
    import hashlib

    from swabench.store import run_folder
    from swabench.spec import traces
    from swabench.impls import registry
    from swabench.publish.markdown import markdown_table

    steps = traces.read(trace)
    names = list(impls) or [i.name for i in registry.all_implementations() if i.kind != "planted"]
    s = traces.scenario(trace, steps, names, backends)
    device = device_of(device)
    if resume and out is None:
        raise InputError("--resume needs --out DIR: the replay to continue")
    out = Path(out) if out else runs.default_out(s.name, device.type, "run")
    outcome = runs.execute(runs.Request(s, out, device, True, resume, l2), Bar())
    weights = traces.weights(steps)
    modes = {c.case_id: c.mode for c in s.cases}
    run_folder.RunStore(out).update_meta(trace={
        "file": str(trace), "sha256": hashlib.sha256(Path(trace).read_bytes()).hexdigest(),
        "steps": sum(steps.values()), "distinct": len(weights), "weights": weights, "modes": modes})
    click.echo(markdown_table(traces.per_thousand_steps(outcome.table, weights, modes)))
    report_outcome(outcome, False, runs.rerun_command(out))


@main.command("models")
def models_cmd():
    """The model presets: each one's sliding-window layer shape and where it was checked."""
    from swabench.spec import models

    click.echo(models.listing())


@main.command()
@click.argument("out", type=click.Path(file_okay=False))
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@opt("--partial", is_flag=True, help="Merge even when shards are missing (the merged run says it is incomplete).")
def merge(out, folders, partial):
    """Merge the shards of one sweep (several GPUs or nodes) into OUT."""
    summary(shards.merge(Path(out), [Path(f) for f in folders], partial)[1], Path(out))


@main.command()
@click.argument("scenario")
@opt("--shards", "count", type=click.IntRange(1), required=True, help="How many array tasks.")
@opt("--out", type=click.Path(file_okay=False), required=True, help="The merged run folder.")
@opt("--executor", type=click.Choice(["auto", "local"]), default="auto", show_default=True,
     help="auto: Slurm where sbatch exists, else local processes (submitit).")
@opt("--partition", help="Slurm partition.")
@opt("--time-min", type=int, default=60, show_default=True, help="Slurm time limit per task, minutes.")
@impl_option
@case_option
@l2_option
@costs_option
def submit(scenario, count, out, executor, partition, time_min, impls, cases, l2, costs_from):
    """Spread SCENARIO over a job array (submitit: Slurm, or local processes), wait, merge into --out."""
    s = load(scenario, impls, cases)  # validate before submitting
    shards.point_costs(costs_from)
    out = Path(out)
    slurm = {"timeout_min": time_min, "gpus_per_node": 1} if executor == "auto" else {}
    slurm.update({"slurm_partition": partition} if partition else {})
    args = [s.path, "--l2", l2, *launch.worker_args(impls, cases, costs_from)]
    table = shards.merge(out, launch.submit(args, count, out, executor, **slurm))[1]
    summary(table, out)
    sys.exit(1 if (table["status"] == "fail").any() else 0)


@main.command()
@click.argument("scenario")
@opt("--jobs", type=click.IntRange(1), default=runs.WARMUP_JOBS, show_default=True, help="Modules built at once.")
@impl_option
def warmup(scenario, jobs, impls):
    """Build every JIT module SCENARIO needs (in parallel) and say what it built and how long it took;
    `swabench run` does the same before timing, so no compile lands in a timed region."""
    from swabench.run import sweep

    click.echo(sweep.warm_up(load(scenario, impls).points, device_of("cuda", "warmup"), jobs).text())


@main.command("compare")
@click.argument("base", type=click.Path(exists=True, file_okay=False))
@click.argument("new", type=click.Path(exists=True, file_okay=False))
@opt("--threshold", type=float, default=0.05, show_default=True,
     help="Smallest relative change of the median that counts (0.05 = 5%).")
@opt("--alpha", type=float, default=0.01, show_default=True, help="Significance level of the U test, in (0, 1).")
@opt("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@opt("--allow-different-gpus", is_flag=True, help="Compare runs made on different devices anyway.")
def compare_cmd(base, new, threshold, alpha, fmt, allow_different_gpus):
    """Point-by-point timing comparison of two run folders; exit 1 on a significant regression."""
    from swabench.analysis import compare

    result = compare.compare(base, new, threshold, alpha, allow_different_gpus)
    for warning in result.warnings:
        click.secho(f"warning: {warning}", fg="yellow", err=True)
    click.echo(compare.to_json(result) if fmt == "json" else compare.to_markdown(result, threshold, alpha))
    sys.exit(1 if result.regressions else 0)


def figures_out(run, out) -> Path:
    from swabench.store import run_folder

    return run_folder.make_folder(Path(out) if out else Path("plots") / Path(run).resolve().name)


def read_run(run):
    from swabench.store import run_folder

    table, meta = derived.load(run)
    note = run_folder.completeness(meta, table)
    if note:
        click.secho(f"{run}: {note}", fg="yellow", err=True)
    return table, meta


@main.command()
@run_dir
@opt("--out", type=click.Path(file_okay=False), help="Folder for the figures (default: plots/RUN_NAME).")
def plot(run_dir, out):
    """Figures of a run folder, PNG and SVG."""
    from swabench.publish import plots

    for name, paths in plots.make_all(*read_run(run_dir), figures_out(run_dir, out)).items():
        click.echo(f"{name:18s} " + (", ".join(map(str, paths)) if paths else "(no points for it in this run)"))


@main.command("report")
@run_dir
@opt("--out", type=click.Path(file_okay=False), help="Folder for REPORT.md and figures (default: plots/RUN_NAME).")
def report_cmd(run_dir, out):
    """One Markdown report (environment, method, correctness, headline, figures) for a pull request."""
    from swabench.publish import report

    read_run(run_dir)
    click.echo(report.write(run_dir, figures_out(run_dir, out)))


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@opt("--out", type=click.Path(dir_okay=False), default="FINDINGS.md", show_default=True, help="The page to write.")
def findings(run_dirs, out):
    """The findings page: what the runs show, each number with the run folder it comes from."""
    from swabench.publish import findings as page

    click.echo(page.write([Path(r) for r in run_dirs], Path(out)))


@main.command("summary")
@run_dir
def summary_cmd(run_dir):
    """Markdown summary of a run folder: the correctness matrix, and the timings if it has any."""
    from swabench.publish import report

    table, meta = read_run(run_dir)
    click.echo("\n\n".join(filter(None, (report.correctness_summary(table, meta), report.timing_summary(table, meta)))))


@main.command("bench-host")
@opt("--out", type=click.Path(file_okay=False), help="Run folder (default: results/host-bench-TIME).")
@opt("--quick", is_flag=True, help="Small batches and contexts only (seconds, for a smoke test).")
def bench_host(out, quick):
    """pytest-benchmark of the host work a step pays (mask build and packing, trimmed page tables,
    indptr arrays), saved as JSON in a run folder and plotted beside it."""
    from swabench.run import hostbench

    for path in hostbench.run(Path(out) if out else hostbench.default_out(), quick):
        click.echo(path)


@main.command()
@click.argument("scenario")
@out_option
@impl_option
@case_option
@opt("--tool", type=click.Choice(["nsys", "torch"]), default="nsys", show_default=True,
     help="nsys: re-run under Nsight Systems; torch: torch.profiler in this process.")
@opt("--against", type=click.Path(exists=True, file_okay=False), default=None,
     help="nsys: a run of the same points without the profiler, whose graph times to hold nsys's against.")
@l2_option
def profile(scenario, out, impls, cases, tool, against, l2):
    """Run SCENARIO under a profiler; tie the kernels it saw to each row of the run folder."""
    from swabench.run import profiling

    device = device_of("cuda", "profile")
    s = load(scenario, impls, cases, device.type)
    out = Path(out) if out else runs.default_out(s.name, device.type, "profile")
    if tool == "torch":
        outcome, text = profiling.run_under_torch_profiler(runs.Request(s, out, device, l2=l2), Bar())
        click.echo(text + f"\nChrome/Perfetto trace and torch_stats.txt are in {out}")
        return report_outcome(outcome, False, runs.rerun_command(out))
    try:
        stats = profiling.run_under_nsys(s.path, out, ["--l2", l2, *launch.worker_args(impls, cases)],
                                         Path(against) if against else None)
    except profiling.ProfileError as e:
        raise click.ClickException(str(e)) from None
    click.echo(stats.to_string(index=False) if len(stats) else "no timed points to attribute")
    click.echo(f"nsys report, sqlite export and nsys_stats.csv are in {out}")


@main.command()
@opt("--peaks", "measure_peaks", is_flag=True, help="Also measure the node's bf16 matmul rate and copy bandwidth.")
def env(measure_peaks):
    """What is installed and usable here: GPU, CUDA, torch, flashinfer, nsys."""
    from swabench.run import environment

    click.echo(environment.describe(device_of("auto"), measure_peaks))
