"""Commands that read run folders: summary, report, plot, findings, compare, matrix and coverage."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from swabench.cli.options import InputError, PathArg, opt, run_dir
from swabench.publish import outputs

force_option = opt("--force", is_flag=True, help="Overwrite a report or figures made from another run folder.")


def read_run(run):
    from swabench.analysis import derived
    from swabench.store import tables

    table, meta = derived.load(run)
    note = tables.completeness(meta, table)
    if note:
        click.secho(f"{run}: {note}", fg="yellow", err=True)
    return table, meta


@click.command("summary")
@run_dir
def summary_cmd(run_dir):
    """Markdown summary of a run folder: the correctness matrix, and the timings if it has any."""
    from swabench.publish import report, sections

    click.echo(report.summary(sections.Run(str(run_dir), *read_run(run_dir))))


@click.command("report")
@run_dir
@opt("--out", type=PathArg(file_okay=False),
     help="Folder for REPORT.md and figures (default: runs/plots/RUN_NAME; plots/RUN_NAME for a published run in "
          "results/).")
@force_option
def report_cmd(run_dir, out, force):
    """One Markdown report (environment, method, correctness, headline, figures) for a pull request."""
    from swabench.publish import report

    from swabench.publish import plots

    read_run(run_dir)
    click.echo(report.write(run_dir, outputs.figures_folder(run_dir, out, ["REPORT.md", *plots.figure_files()],
                                                            force)))


@click.command()
@run_dir
@opt("--out", type=PathArg(file_okay=False),
     help="Folder for the figures (default: runs/plots/RUN_NAME; plots/RUN_NAME for a published run in results/).")
@force_option
def plot(run_dir, out, force):
    """Figures of a run folder, as PNG."""
    from swabench.publish import plots

    table, meta = read_run(run_dir)  # a run that cannot be read makes no folder
    for name, paths in plots.make_all(table, meta, outputs.figures_folder(run_dir, out, plots.figure_files(),
                                                                           force)).items():
        click.echo(f"{name:18s} " + (", ".join(map(str, paths)) if paths else "(no points for it in this run)"))


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=PathArg(exists=True, file_okay=False))
@opt("--out", type=PathArg(dir_okay=False), metavar="FILE",
     help="Write the page to FILE (e.g. FINDINGS.md) and its topic pages to findings/ beside it; every page is "
          "printed to stdout without --out.")
@opt("--force", is_flag=True, help="Replace FILE, or a file in findings/ beside it, that is no findings page.")
def findings(run_dirs, out, force):
    """The findings page: what the runs show, each number with the run folder it comes from; the answers and
    the runs on the page, each topic's detail on a page of its own. Printed to stdout unless --out names the
    file to write."""
    from swabench.publish import findings as page

    if out is None:
        click.echo(page.page(page.load(run_dirs)), nl=False)
        return
    written = page.write([Path(r) for r in run_dirs], outputs.file_path(out, run_dirs), force)
    click.echo(f"{written[0]} and {len(written) - 1} topic pages in {written[0].parent / 'findings'}"
               if len(written) > 1 else written[0])


@click.command("compare")
@click.argument("base", type=PathArg(exists=True, file_okay=False))
@click.argument("new", type=PathArg(exists=True, file_okay=False))
@opt("--threshold", type=float, default=0.05, show_default=True,
     help="Smallest relative change of the median that counts (0.05 = 5%); a point whose noise (IQR / median) "
          "is above it in either run is 'too noisy' to judge, never a regression.")
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


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=PathArg(exists=True, file_okay=False))
@opt("--out", type=PathArg(file_okay=False),
     help="Folder for MATRIX.md, matrix.csv and matrix.png (default: runs/plots/matrix-SCENARIO; "
          "plots/matrix-SCENARIO for published runs in results/).")
@opt("--library", default="flashinfer", show_default=True,
     help="The library under test whose releases the runs differ in (meta.json records its release).")
@opt("--unbuilt", multiple=True, metavar="RELEASE=WHY",
     help="A release that could not be built or installed where the runs were made, and why (repeatable): a row "
          "of the matrix says so.")
@opt("--threshold", type=float, default=0.05, show_default=True,
     help="Smallest relative change of a point's median that counts (as in compare).")
@opt("--alpha", type=float, default=0.01, show_default=True, help="Significance level of the U test, in (0, 1).")
@opt("--force", is_flag=True, help="Overwrite a matrix made from other run folders.")
def matrix(run_dirs, out, library, unbuilt, threshold, alpha, force):
    """One scenario run on several releases of a library, side by side: points per status of each
    implementation, the declared upstream bugs each release shows, and each timed point against the
    newest release (compare's rule)."""
    from swabench.analysis import matrix as release_matrix
    from swabench.publish import matrix as page

    why = {}
    for item in unbuilt:
        release, sep, reason = item.partition("=")
        if not sep or not release.strip() or not reason.strip():
            raise InputError(f"--unbuilt: give RELEASE=WHY (e.g. 0.6.0=no wheel for Python 3.12), got {item!r}")
        if release.strip() in why:
            raise InputError(f"--unbuilt: {release.strip()} is given twice: give each release once")
        why[release.strip()] = reason.strip()
    m = release_matrix.build(run_dirs, library, threshold, alpha, unbuilt=why)
    for warning in m.warnings:
        click.secho(f"warning: {warning}", fg="yellow", err=True)
    for path in page.write(m, outputs.matrix_folder(out, m.scenario, run_dirs, force), why, threshold, alpha):
        click.echo(path)


@click.command("coverage")
@click.argument("run_dirs", nargs=-1, required=True, type=PathArg(exists=True, file_okay=False))
@opt("--gaps", is_flag=True, help="Only the paths never run on a GPU.")
def coverage_cmd(run_dirs, gaps):
    """Which declared paths (implementation x storage x step) have run on a GPU: for each, the newest of the RUN
    folders (or folders of run folders, such as results/) where it came through the gate on a GPU, why no case can
    run it, or 'never run on a GPU'."""
    from swabench.analysis import coverage
    from swabench.impls import registry
    from swabench.publish.markdown import markdown_table

    rows = coverage.coverage(registry.all_implementations(), coverage.load(run_dirs))
    shown = [r for r in rows if r.gap] if gaps else rows
    click.echo(f"{coverage.headline(rows)}.\n\n" + (markdown_table(coverage.frame(shown)) if shown else ""))


COMMANDS = [summary_cmd, report_cmd, plot, findings, compare_cmd, matrix, coverage_cmd]
