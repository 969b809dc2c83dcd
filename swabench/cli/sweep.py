"""Commands that expand a scenario and sweep its points: run, check, replay, warmup, and the ones that
only show what a sweep would do (list, show, models)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from swabench.cli.options import (Bar, InputError, PathArg, case_option, costs_option, device_of, impl_option,
                                  l2_option, load, model_option, model_scenario, opt, out_option, report_outcome,
                                  run_options, scenario_file)
from swabench.run import launch, lifecycle, multigpu, shards
from swabench.inputs import scenarios
from swabench.inputs.scenarios import matches
from swabench.inputs.plan_calls import VERIFY_MAX

MAX_BUCKET = 1 << 16  # coarser than this merges steps a window apart: no longer the server's steps


def sweep_command(scenario, out, device, impls, cases, resume, strict, timed, l2="cold", shard=None, costs_from=None,
                  model=None, counted=False, supervision=None, patch=None):
    from swabench.run import patched_release

    patched = {"patch": patched_release.activate(patch)} if patch else None  # before anything imports the library
    device = device_of(device)
    supervision = supervision or {}
    if supervision.get("retry_crashed") and not resume:
        raise InputError("--retry-crashed runs a resumed run's crashed points again: use it with --resume")
    if counted and device.type != "cuda":
        raise InputError("--count: the counted calls are for Nsight Compute on a GPU (swabench profile --tool ncu)")
    s = load(model_scenario(scenario, model, device.type), impls, cases, device.type, model)
    lifecycle.check_runnable(s, device)  # the whole sweep's, before a shard of it is cut
    sharding = shards.select_shard(s, shard, costs_from) if shard else None
    if resume and out is None:
        raise InputError("--resume needs --out DIR: the run folder to continue")
    isolated = not supervision.get("in_process") and lifecycle.isolation.isolated_by_default()
    request = lifecycle.Request(s, out, device, timed, resume, l2, sharding, patched, counted=counted,
                                isolated=isolated, retry_crashed=bool(supervision.get("retry_crashed")),
                                limits=lifecycle.isolation.Limits(point_s=supervision.get("point_timeout") or
                                                                  lifecycle.isolation.POINT_LIMIT_S))
    out = Path(out) if out else lifecycle.default_out(s.name, device.type, request.what)
    outcome = lifecycle.execute(dataclasses.replace(request, out=out), Bar())
    report_outcome(outcome, strict, lifecycle.rerun_command(out))


@click.command()
@click.argument("scenario", type=PathArg(), required=False)
@run_options
@l2_option
@opt("--shard", metavar="I/N", help="Only shard I of N (for several nodes; merge after).")
@opt("--gpus", metavar="all|N|0,2", help="One worker per GPU on this node, each on its own shard, merged into --out.")
@costs_option
@opt("--count", "counted", is_flag=True, hidden=True,
     help="Gate, then count one call per point instead of timing it: what `profile --tool ncu` runs under ncu.")
def run(scenario, out, device, impls, cases, model, resume, strict, retry_crashed, point_timeout, in_process, patch, l2,
        shard, gpus, costs_from, counted):
    """Gate and time every point of SCENARIO (a file, or a scenario name: see `swabench list`).

    Without SCENARIO: default.toml on a GPU, cpu.toml (the embedded backend) elsewhere."""
    if gpus and counted:
        raise InputError("--count with --gpus: a run under Nsight Compute counts on one GPU (swabench profile --tool ncu)")
    if gpus and patch:
        raise InputError("--patch runs a patched release on one GPU: drop --gpus")
    if gpus and (shard or resume or device == "cpu"):
        raise InputError("--gpus shards, and resumes, on its own GPUs: drop --shard, --resume and --device cpu "
                         "(run the same command again to continue a launch)")
    supervision = dict(retry_crashed=retry_crashed, point_timeout=point_timeout, in_process=in_process)
    if gpus:
        return run_on_gpus(model_scenario(scenario, model, "cuda"), out, impls, cases, l2, gpus, costs_from, strict,
                           model, supervision)
    if costs_from and not shard:
        raise InputError("--costs-from balances shards: use it with --shard or --gpus")
    sweep_command(scenario, out, device, impls, cases, resume, strict, not counted, l2, shard, costs_from, model,
                  counted, supervision, patch)


def run_on_gpus(scenario, out, impls, cases, l2, gpus, costs_from, strict, model=None, supervision=None) -> None:
    chosen, visible = launch.choose_gpus(gpus)
    path = scenario_file(scenario, "cuda")
    out = Path(out) if out else lifecycle.default_out(scenarios.declared_name(scenarios.read(path)[0], path), "cuda", "run")

    def validate():
        import torch

        shards.point_costs(costs_from)
        s = load(path, impls, cases, "cuda", model)
        lifecycle.check_runnable(s, torch.device("cuda"))
        shards.check_count(len(chosen), len(s.points), f"--gpus {gpus}")
        return s

    supervision = supervision or {}
    args = ["--l2", l2, *launch.worker_args(impls, cases, costs_from), *(["--model", model] if model else []),
            "--point-timeout", str(supervision.get("point_timeout") or lifecycle.isolation.POINT_LIMIT_S),
            *(["--in-process"] if supervision.get("in_process") else [])]  # SWABENCH_IN_PROCESS: the workers' env
    outcome = multigpu.execute(multigpu.GpuLaunch(path, out, chosen, visible, args, validate), Bar())
    report_outcome(outcome, strict, lifecycle.rerun_command(out, resume=False))


@click.command()
@click.argument("scenario", type=PathArg(), required=False)
@run_options
def check(scenario, out, device, impls, cases, model, resume, strict, retry_crashed, point_timeout, in_process, patch):
    """Run the correctness gate only (no timing): a correctness matrix of case x implementation."""
    if not scenario and not model:
        raise InputError("check needs SCENARIO or --model NAME")
    sweep_command(scenario, out, device, impls, cases, resume, strict, timed=False, model=model,
                  supervision=dict(retry_crashed=retry_crashed, point_timeout=point_timeout, in_process=in_process),
                  patch=patch)


def step_options(command):
    """The options of the commands that time a set of steps (replay, price)."""
    for option in reversed([
            impl_option,
            opt("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                help="Where to run; auto picks CUDA when it is there."),
            out_option,
            opt("--resume", is_flag=True, help="Continue the run in --out, skipping the points it already has."),
            opt("--backend", "backends", multiple=True, metavar="NAME",
                help="A library backend each step runs through (repeatable; default: fa2, fa3, cudnn, xqa, fmha-v2, "
                     "fa4, vllm-fa3 and sgl-fa3, every backend a library serves steps with; the shelf's xqa and "
                     "fmha-v2 take minutes to build their JIT modules)."),
            l2_option]):
        command = option(command)
    return command


@click.command()
@click.argument("trace", type=PathArg(exists=True, dir_okay=False))
@step_options
def replay(trace, impls, device, out, resume, backends, l2):
    """Gate and time every distinct step of TRACE once, weighted by how often it occurs: attention
    time per 1000 steps of that mix, per implementation.  TRACE is JSON Lines, one serving step a line:
    {"mode": "decode", "model": "gpt-oss-120b", "requests": [[PREFIX, QUERIES], ...], "count": N}
    (mode extend, verify or decode; the layer a model preset or its shape axes; count optional)."""
    from swabench.publish.markdown import markdown_table
    from swabench.run import replay as replaying

    if resume and out is None:
        raise InputError("--resume needs --out DIR: the replay to continue")
    request = replaying.request(trace, impls, backends, out, device_of(device), resume, l2)
    outcome = lifecycle.execute(request, Bar())
    table = replaying.weigh(outcome, request)
    click.echo(markdown_table(table) if len(table) else "no step was timed: nothing to weigh")
    report_outcome(outcome, False, lifecycle.rerun_command(request.out))


@click.command()
@opt("--model", "model_name", required=True, metavar="NAME", help="The model preset (`swabench models` lists them).")
@click.argument("trace", required=False, type=PathArg(exists=True, dir_okay=False))
@step_options
def price(model_name, trace, impls, device, out, resume, backends, l2):
    """Attention per step for a whole model: its windowed layers (sliding or chunked) and its global layers, each
    layer step at its fastest correct path, in milliseconds per 1000 model steps, with the windowed layers' share,
    what the naive mask or the full-table decode would cost there instead, and the KV bytes a request holds with
    and without evicting out-of-window pages.  Steps: TRACE's lines of the model, else its steps in models.toml.
    Paths: the engines' correct ones (--impl to choose; the peers and the known bugs belong to `run`)."""
    from swabench.analysis import price as weighing
    from swabench.publish.markdown import markdown_table
    from swabench.run import price as pricing
    from swabench.run import replay as replaying
    from swabench.store import run_folder, schema

    if resume and out is None:
        raise InputError("--resume needs --out DIR: the pricing to continue")
    request = pricing.request(model_name, trace, impls, backends, out, device_of(device), resume, l2)
    outcome = lifecycle.execute(request, Bar())
    if outcome.state != "complete":  # a price over some of the steps would read as the whole model's
        click.echo(f"{model_name}: the pricing is {outcome.state}: no {schema.PRICE} until every step is weighed")
        report_outcome(outcome, False, lifecycle.rerun_command(request.out))
        return
    replaying.weigh(outcome, request)
    table = weighing.per_mode(outcome.table, request.meta)
    run_folder.atomic_write(outcome.folder / schema.PRICE, table.to_csv(index=False))
    click.echo(f"{model_name}: {request.meta['price']['windowed_layers']} windowed of "
               f"{request.meta['price']['num_layers']} layers; milliseconds of attention per 1000 model steps")
    click.echo(markdown_table(table))
    for column, why in weighing.blanks(outcome.table, request.meta).items():
        click.echo(f"\"{column}\" is blank: {'; '.join(why)}")
    click.echo("KV MiB a request holds:")
    click.echo(markdown_table(weighing.kv(request.meta)))
    report_outcome(outcome, False, lifecycle.rerun_command(request.out))


@click.command("import")
@click.argument("dump_dir", type=PathArg(exists=True, file_okay=False))
@opt("--out", required=True, type=PathArg(dir_okay=False), metavar="TRACE.jsonl", help="The trace to write.")
@opt("--bucket", type=click.IntRange(1, MAX_BUCKET), default=1, show_default=True,
     help=f"Round each request's prefix up to a multiple of N (at most {MAX_BUCKET}), so that steps a few tokens "
          f"apart share a line.")
@opt("--verify-max", type=click.IntRange(2), default=VERIFY_MAX, show_default=True,
     help="The most queries per request a verify step has: a step whose requests all have the same number of "
          "queries, more than one and at most N, after a prefix is verify; more is chunked prefill (extend).")
@opt("--force", is_flag=True, help="Overwrite TRACE.jsonl if it exists.")
def import_cmd(dump_dir, out, bucket, verify_max, force):
    """Make a trace for `swabench replay` from FlashInfer's own API log of a running server
    (FLASHINFER_LOGLEVEL=10, FLASHINFER_DUMP_INCLUDE='*Wrapper.plan', FLASHINFER_DUMP_DIR=DUMP_DIR): one line
    per distinct step of a layer with a window, with how often it ran."""
    import shlex

    from swabench.publish import outputs
    from swabench.inputs import dumps
    from swabench.store import run_folder

    target = outputs.file_path(out, [dump_dir])
    if target.exists() and not force:
        raise InputError(f"--out: {target} exists (--force to overwrite it)")
    imported = dumps.read(Path(dump_dir), bucket, Bar(), verify_max)
    run_folder.atomic_write(target, dumps.to_jsonl(imported))
    click.echo(imported.summary())
    click.echo(f"wrote {target}: swabench replay {shlex.quote(str(target))}")


@click.command()
@click.argument("scenarios", type=PathArg(), nargs=-1, required=True)
@opt("--jobs", type=click.IntRange(1), default=lifecycle.WARMUP_JOBS, show_default=True, help="Modules built at once.")
@impl_option
@case_option
@opt("--list", "list_only", is_flag=True, help="Only list the module signatures the scenarios need (no GPU needed, "
                                               "nothing built).")
def warmup(scenarios, jobs, impls, cases, list_only):
    """Build every JIT module the SCENARIOS need (in parallel, all of them at once) and say what it built
    and how long it took; `swabench run` does the same before timing, so no compile lands in a timed
    region."""
    from swabench.run import sweep

    loaded = [load(name, impls) for name in scenarios]  # every file checked before any build
    points = [p for s in loaded for p in s.points]
    if cases:  # a filter need only match in some of them: each scenario keeps what it has of it
        picked = [p for p in points if matches(p, cases)]
        if not picked:
            load(scenarios[0], impls, cases)  # says which cases there are
        points = picked
    needed = sweep.modules_needed(points, None)
    if not needed:  # nothing a GPU would build either: not an error without one
        click.echo(f"nothing to build: no point of {', '.join(scenarios)} needs a JIT-compiled module")
        return
    if list_only:
        click.echo(f"{len(needed)} module signatures (implementation, backend, dtype, head_dim, window, features):")
        click.echo("\n".join(f"  {s}" for s in sorted(needed)))
        return
    def said(label, seconds, error):
        click.echo(f"  {seconds:8.1f} s  {label}" + (f"  FAILED: {error}" if error else ""), err=True)

    click.echo(f"building the modules of {len(needed)} signatures, {jobs} at once, in a supervised worker; each as it "
               f"ends:", err=True)
    supervisor = lifecycle.isolation.Supervisor(sweep.SweepOptions(device=device_of("cuda", "warmup")))
    try:
        click.echo(supervisor.warm_up(points, jobs, on_built=said).text())
    finally:
        supervisor.close(now=True)


@click.command("list")
def list_cmd():
    """Scenario files and implementations."""
    from swabench.impls import registry

    click.echo("scenarios:\n" + scenarios.listing() + "\n\nimplementations:\n" + registry.listing(device_of("auto")))


@click.command()
@click.argument("scenario", type=PathArg(), required=False)
@impl_option
@model_option
@opt("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
     help="With --model and no SCENARIO: which device's template to show (auto: this machine's, as run uses).")
@opt("--cases", "each", is_flag=True, help="Also list every case with its memory estimate.")
def show(scenario, impls, model, device, each):
    """What SCENARIO expands to: cases, implementations, axes, skips, memory."""
    if not scenario and not model:
        raise InputError("show needs SCENARIO or --model NAME")
    if device == "auto" and model and not scenario:  # only then does the device matter
        device = device_of("auto").type
    click.echo(scenarios.describe(load(model_scenario(scenario, model, device), impls, model=model), each))


@click.command("models")
def models_cmd():
    """The model presets: each one's sliding-window layer shape and where it was checked."""
    from swabench.inputs import models

    click.echo(models.listing())


COMMANDS = [run, check, replay, price, import_cmd, warmup, list_cmd, show, models_cmd]
