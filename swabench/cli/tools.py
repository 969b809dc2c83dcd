"""Commands around the sweep: profile (nsys, torch.profiler), bench-host (the host work) and env."""

from __future__ import annotations

from pathlib import Path

import click

from swabench.cli.options import (Bar, case_option, device_of, impl_option, l2_option, load, opt, out_option,
                                  report_outcome)
from swabench.run import launch, lifecycle


@click.command()
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
    out = Path(out) if out else lifecycle.default_out(s.name, device.type, "profile")
    if tool == "torch":
        outcome, text = profiling.run_under_torch_profiler(lifecycle.Request(s, out, device, l2=l2), Bar())
        click.echo(text + f"\nChrome/Perfetto trace and torch_stats.txt are in {out}")
        return report_outcome(outcome, False, lifecycle.rerun_command(out))
    try:
        stats = profiling.run_under_nsys(s.path, out, ["--l2", l2, *launch.worker_args(impls, cases)],
                                         Path(against) if against else None)
    except profiling.ProfileError as e:
        raise click.ClickException(str(e)) from None
    click.echo(stats.to_string(index=False) if len(stats) else "no timed points to attribute")
    click.echo(f"nsys report, sqlite export and nsys_stats.csv are in {out}")


@click.command("bench-host")
@opt("--out", type=click.Path(file_okay=False), help="Run folder (default: results/host-bench-TIME).")
@opt("--quick", is_flag=True, help="Small batches and contexts only (seconds, for a smoke test).")
def bench_host(out, quick):
    """pytest-benchmark of the host work a step pays (mask build and packing, trimmed page tables,
    indptr arrays), saved as JSON in a run folder and plotted beside it."""
    from swabench.run import hostbench

    for path in hostbench.bench(Path(out) if out else hostbench.default_out(), quick):
        click.echo(path)


@click.command()
@opt("--peaks", "measure_peaks", is_flag=True, help="Also measure the node's bf16 matmul rate and copy bandwidth.")
def env(measure_peaks):
    """What is installed and usable here: GPU, CUDA, torch, each library's version, nsys."""
    from swabench.run import environment

    click.echo(environment.describe(device_of("auto"), measure_peaks))


COMMANDS = [profile, bench_host, env]
