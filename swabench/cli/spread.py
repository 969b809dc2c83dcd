"""Commands that spread a sweep over nodes and bring it back: submit (a job array) and merge."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from swabench.cli.options import (Bar, PathArg, case_option, costs_option, impl_option, l2_option, load, opt,
                                  summary)
from swabench.run import launch, lifecycle, shards
from swabench.store import paths, places


@click.command()
@click.argument("out", type=PathArg(file_okay=False))
@click.argument("folders", nargs=-1, required=True, type=PathArg(exists=True, file_okay=False))
@opt("--partial", is_flag=True, help="Merge even when shards are missing (the merged run says it is incomplete).")
def merge(out, folders, partial):
    """Merge the shards of one sweep (several GPUs or nodes) into OUT."""
    out = places.check_new_run(out, "OUT")
    paths.refuse_inside(out, folders, "OUT")
    summary(shards.merge(out, [Path(f) for f in folders], partial)[1], out)


@click.command()
@click.argument("scenario", type=PathArg())
@opt("--shards", "count", type=click.IntRange(1), required=True,
     help="How many array tasks (at most the sweep's points; local processes run at most one per core at once).")
@opt("--out", type=PathArg(file_okay=False), required=True, help="The merged run folder.")
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
    shards.check_count(count, len(s.points))
    shards.point_costs(costs_from)
    out = launch.check_out(out)
    slurm = {"timeout_min": time_min, "gpus_per_node": 1} if executor == "auto" else {}
    slurm.update({"slurm_partition": partition} if partition else {})
    args = [s.path, "--l2", l2, *launch.worker_args(impls, cases, costs_from)]
    table = shards.merge(out, launch.submit(args, count, out, executor, say=Bar().note, **slurm))[1]
    summary(table, out)
    sys.exit(lifecycle.gate_status(table))


COMMANDS = [merge, submit]
