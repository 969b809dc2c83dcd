"""export-fib and import-fib: a trace in FlashInfer-Bench's format and back (docs/flashinfer-bench.md)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from swabench.cli.options import InputError, PathArg, opt


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


def _shown(path: Path) -> str:
    """``path`` relative to the working folder where it lies under it, else as it is."""
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd()) else str(path)
    except (OSError, ValueError):
        return str(path)


@click.command("export-fib")
@click.argument("source", type=PathArg(), metavar="TRACE|RUN")
@opt("--out", required=True, type=PathArg(file_okay=False), metavar="DIR",
     help="The FlashInfer-Bench folder to write (definitions/, workloads/, blob/): absent or empty.")
@opt("--force", is_flag=True, help="Replace DIR when it holds a FlashInfer-Bench folder export-fib wrote (never a "
     "file it did not write).")
def export_fib(source, out, force):
    """Write the steps of TRACE (JSON Lines, see `swabench replay --help`) or of a replay's run folder RUN as
    FlashInfer-Bench Definitions and Workloads: one definition per layer type and stage (decode; prefill for
    extend and verify), its window in its name (gqa_paged_decode_swa_w1023_h8_kv2_d128_ps16), as a const axis
    window_left and in its reference, with its sinks and soft-cap; one workload per distinct step, its page
    table stored, its count and mode in the blob's metadata so that import-fib gives the trace back.  Steps
    with no such definition (ragged storage, no window, chunked or non-causal) are left out, each named."""
    from swabench.inputs import fib

    result = fib.export(source, out, replace=force)
    for d in result.definitions:
        click.echo(f"{d.name}: {_n(d.count, 'workload')} ({_n(d.steps, 'step')}): {_shown(d.definition)}, "
                   f"{_shown(d.workloads)}")
    for label, count, why in result.left_out:
        click.echo(f"left out {label} ({_n(count, 'step')}): {why}", err=True)
    workloads = sum(d.count for d in result.definitions)
    click.echo(f"wrote {_shown(result.out)}: {_n(len(result.definitions), 'definition')}, {_n(workloads, 'workload')}, "
               f"{_n(sum(d.steps for d in result.definitions), 'step')}; "
               + (f"read back with flashinfer-bench {result.checked}'s loaders" if result.checked else
                  "not read back: flashinfer-bench is not installed (pip install 'swabench[fib]')"))


@click.command("import-fib")
@click.argument("fib_dir", type=PathArg(), metavar="DIR")
@opt("--definition", required=True, metavar="NAME", help="The definition whose workloads to read.")
@opt("--model", required=True, metavar="PRESET", help="The model preset of the layer (`swabench models`): it "
                                                     "gives the window.")
@opt("--out", required=True, type=PathArg(dir_okay=False), metavar="TRACE.jsonl", help="The trace to write.")
@opt("--force", is_flag=True, help="Overwrite TRACE.jsonl if it exists.")
def import_fib(fib_dir, definition, model, out, force):
    """Make a trace for `swabench replay` from one definition's workloads in the FlashInfer-Bench folder DIR:
    each request's queries and keys from the stored qo_indptr, kv_indptr, kv_indices and kv_last_page_len.
    The window comes from PRESET: workloads do not carry it, and FlashInfer-Bench's own definitions carry no
    window, sinks or soft-cap (there the preset gives all three).  A definition export-fib wrote carries its
    window, sinks and soft-cap, and a preset that disagrees is refused."""
    from swabench.inputs import fib_import
    from swabench.publish import outputs

    target = outputs.file_path(out, [fib_dir])
    if target.exists() and not force:
        raise InputError(f"--out: {target} exists (--force to overwrite it)")
    result = fib_import.import_(fib_dir, definition, model, target)
    click.echo(f"wrote {_shown(target)}: {_n(result.lines, 'line')}, {_n(result.steps, 'step')} of {definition} as {model} "
               f"(window from the {result.window_from}): swabench replay {shlex.quote(_shown(target))}")


COMMANDS = [export_fib, import_fib]
