"""``swabench repro``: a standalone script for a point or a known bug, to file upstream."""

from __future__ import annotations

import time

import click

from swabench.cli.options import InputError, PathArg, opt


@click.command()
@click.argument("source", type=PathArg(), required=False, metavar="[RUN | SCENARIO]")
@opt("--case", "case_id", metavar="ID", help="The case (a case_id or a unique prefix of one).")
@opt("--impl", metavar="NAME", help="The implementation.")
@opt("--backend", metavar="B", help="Its backend (default: fa2 where it runs there, else the scenario's first).")
@opt("--bug", metavar="REF", help="A known bug instead: an upstream issue (flashinfer#4972), a known-bug or planted "
                                  "implementation, or decode-cliff; on the smallest shipped case where it shows.")
@opt("--out", type=PathArg(dir_okay=False), help="Write the script here (default: print it).")
@opt("--observed", "observed", multiple=True, type=PathArg(exists=True, dir_okay=False), metavar="LOG",
     help="The output of a run of the script (repeatable, one per release or GPU): its verdict goes into the top "
          "comment as what was observed there.")
@opt("--issue", is_flag=True, help="With --bug and --out: also write the issue body to file beside the script "
                                   "(FILE.md: what happens, expected, the control, the script and its output).")
@opt("--measured", "measured", multiple=True, type=PathArg(exists=True, file_okay=False), metavar="RUN",
     help="With --issue: a run folder whose gated points of the bug's path the body quotes as a table "
          "(repeatable).")
@opt("--force", is_flag=True, help="Replace an existing --out file.")
def repro(source, case_id, impl, backend, bug, out, observed, issue, measured, force):
    """Write a script that reproduces one point, or a known bug, with torch and the library only.

    The script builds the case's inputs as the suite does, makes the path's own calls (traced from the
    suite's code and checked call by call against it on a stand-in before it is written), compares with
    a reference written out in it, and exits 1 where the output is wrong."""
    from swabench.publish import outputs
    from swabench.repro import make
    from swabench.store import run_folder

    if bug and (source or case_id or impl or backend):
        raise InputError("--bug takes no RUN, SCENARIO, --case, --impl or --backend")
    if (observed or issue) and not bug:
        raise InputError("--observed and --issue go with --bug REF")
    if issue and not out:
        raise InputError("--issue writes FILE.md beside the script: give --out FILE")
    if measured and not issue:
        raise InputError("--measured goes with --issue: its rows are quoted in the issue body")
    from swabench.repro import issue as filing

    seen = [filing.read(log) for log in observed]  # every log and run read before any work
    table = make.measured_table(bug, measured) if measured else []
    if not bug and not (source and case_id and impl):
        raise InputError("give RUN or SCENARIO with --case and --impl, or --bug REF "
                         "(`swabench repro --help` lists the forms)")
    if out:  # never over what the command reads: the run folder or scenario file, or the shipped scenarios searched
        from swabench.repro import bugs

        reads = ([source, make.source_file(source)] if source else bugs.shipped_files()) + list(observed) + \
            list(measured)
        out = outputs.file_path(out, reads)
        if issue and out.with_suffix(".md") == out:
            raise InputError(f"--out {out}: with --issue the issue body goes to {out.with_suffix('.md')}, the script's "
                             f"own path; name the script FILE.py")
        if issue:
            outputs.file_path(out.with_suffix(".md"), reads, "--out's issue body")
        for path in [out] + ([out.with_suffix(".md")] if issue else []):
            if path.exists() and not force:
                raise InputError(f"--out: {path} exists; give --force to replace it")
    started = time.perf_counter()

    def progress(stage: str) -> None:
        click.echo(f"repro [{time.perf_counter() - started:5.1f} s] {stage}", err=True)

    text, _ = make.for_bug(bug, progress, seen) if bug else make.for_point(source, case_id, impl, backend, progress)
    if not out:
        click.echo(text, nl=False)
        return
    if issue:
        body = out.with_suffix(".md")
        run_folder.atomic_write(body, make.issue_body(bug, text, out.name, seen, table))
        click.echo(f"wrote {body}: the issue body", err=True)
    run_folder.atomic_write(out, text)
    click.echo(f"wrote {out}: run it with `python3 {out}`", err=True)


COMMANDS = [repro]
