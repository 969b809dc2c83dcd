"""Commands around the sweep: profile (nsys, torch.profiler), bench-host (the host work) and env."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from swabench.cli.options import (Bar, InputError, PathArg, case_option, device_of, impl_option, l2_option, load, opt,
                                  out_option, report_outcome)
from swabench.run import launch, lifecycle


@click.command()
@click.argument("scenario", type=PathArg())
@out_option
@impl_option
@case_option
@opt("--tool", type=click.Choice(["nsys", "ncu", "torch"]), default="nsys", show_default=True,
     help="nsys: re-run under Nsight Systems (kernel times); ncu: re-run under Nsight Compute (the DRAM and L2 "
          "bytes each kernel of a point's call moves); torch: torch.profiler in this process.")
@opt("--against", type=PathArg(exists=True, file_okay=False), default=None,
     help="nsys: a run of the same points without the profiler, whose graph times to hold nsys's against.")
@opt("--ncu-unit", "unit", type=click.Choice(["kernel", "call"]), default="kernel", show_default=True,
     help="ncu: count each kernel of a point's call on its own, L2 flushed before each (kernel), or the whole call "
          "as one workload, L2 flushed once before it (call: for calls of hundreds of small kernels, such as the "
          "per-request PyTorch loops, faster and without re-reading what one kernel leaves in L2 for the next).")
@l2_option
def profile(scenario, out, impls, cases, tool, against, unit, l2):
    """Run SCENARIO under a profiler; tie the kernels it saw to each row of the run folder."""
    from swabench.run import profiling

    if against and tool != "nsys":
        raise InputError("--against: nsys only (ncu and torch.profiler have no graph times to hold against)")
    if unit != "kernel" and tool != "ncu":
        raise InputError(f"--ncu-unit {unit}: ncu only (--tool ncu)")
    device = device_of("cuda", "profile")
    s = load(scenario, impls, cases, device.type)
    lifecycle.check_runnable(s, device)
    out = Path(out) if out else lifecycle.default_out(s.name, device.type, "profile")
    if tool == "ncu":
        try:
            result = profiling.run_under_ncu(s.path, out, launch.worker_args(impls, cases), l2, unit)
        except profiling.ProfileError as e:
            raise click.ClickException(str(e)) from None
        sys.exit(0 if print_counted(result, out) else 1)
    if tool == "torch":
        outcome, text = profiling.run_under_torch_profiler(lifecycle.Request(s, out, device, l2=l2, isolated=False),
                                                             Bar())
        click.echo(text + f"\nChrome/Perfetto trace and torch_stats.txt are in {out}")
        return report_outcome(outcome, False, lifecycle.rerun_command(out))
    try:
        stats = profiling.run_under_nsys(s.path, out, ["--l2", l2, *launch.worker_args(impls, cases)],
                                         Path(against) if against else None)
    except profiling.ProfileError as e:
        raise click.ClickException(str(e)) from None
    click.echo(stats.to_string(index=False) if len(stats) else "no timed points to attribute")
    click.echo(f"nsys report, sqlite export and nsys_stats.csv are in {out}")


def print_counted(result, out: Path) -> bool:
    """What a run under ncu says: each point's bytes against what its window needs, or why there are none;
    False when the calibration copy says the counter is not to be trusted (exit 1)."""
    from swabench.analysis import derived
    from swabench.publish.markdown import markdown_table
    from swabench.publish.sections import Run, machine

    if result.kernels is None:
        click.secho(f"ncu: skipped: {result.skipped}", fg="yellow", err=True)
        if (out / "meta.json").exists():
            click.echo(f"the gated run, without counters, is in {out}")
        return True
    table = machine.bytes_table(Run(str(out), *derived.load(out)))
    click.echo(markdown_table(table) if len(table) else "no point was counted")
    click.echo(f"ncu.csv (every counted kernel), ncu.log and profile.ncu-rep are in {out}; "
               f"{result.meta.get('per_point_s')} s a point under ncu")
    calibration = result.meta["calibration"]
    if calibration.get("trusted") is False:
        read = "was not counted" if calibration.get("read_ratio") is None else \
            f"read {calibration['read_ratio']:.4f}x its {calibration['bytes']} bytes"
        click.secho(f"the calibration copy {read}: outside 1%, the counters of this run are not to be trusted",
                    fg="red", err=True)
        return False
    return True


@click.command("bench-host")
@opt("--out", type=PathArg(file_okay=False), help="Run folder (default: runs/host-bench-TIME).")
@opt("--quick", is_flag=True, help="Small batches and contexts only (seconds, for a smoke test).")
def bench_host(out, quick):
    """pytest-benchmark of the host work a step pays (mask build and packing, trimmed page tables,
    indptr arrays), saved as JSON in a run folder and plotted beside it."""
    from swabench.run import hostbench

    for path in hostbench.bench(Path(out) if out else hostbench.default_out(), quick):
        click.echo(path)


@click.command()
@opt("--peaks", "measure_peaks", is_flag=True,
     help="Also measure the node's bf16 matmul rate, copy and read bandwidth, and read its peak at maximum clocks (NVML).")
def env(measure_peaks):
    """What is installed and usable here: GPU, CUDA, torch, each library's version, nsys."""
    from swabench.run import environment

    click.echo(environment.describe(device_of("auto"), measure_peaks))


COMMANDS = [profile, bench_host, env]
