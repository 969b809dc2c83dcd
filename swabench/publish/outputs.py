"""Where a report, figures, a findings page, a release matrix or a trace may be written: a plain file
or folder (store.paths), outside every run folder and everything the command reads, in a folder
that can be written, and never over the report, figures or matrix made from other run folders
unless asked."""

from __future__ import annotations

from pathlib import Path

from swabench.store import paths, run_folder
from swabench.store.paths import OutputError  # noqa: F401  (re-exported)

MADE_FROM = ".swabench-made-from"  # in a report's, figures' or matrix's folder: the run folders they were made from


def made_from(folder: Path) -> str | None:
    """The run folders (resolved, one a line) ``folder``'s report, figures or matrix were made from,
    when it says; "unknown run folders" for a matrix that does not say."""
    marker = folder / MADE_FROM
    if marker.is_file():
        return marker.read_text().strip() or None
    report, matrix = folder / "REPORT.md", folder / "MATRIX.md"
    lines = report.read_text(errors="replace").splitlines() if report.is_file() else []
    named = next((line.split("`")[1] for line in lines if line.startswith("Run folder `")), None)
    if named:
        return str(Path(named).resolve())
    if not matrix.is_file():
        return None
    releases = matrix.read_text(errors="replace").partition("## Releases")[2].partition("\n## ")[0]
    runs = [line.split("`")[1] for line in releases.splitlines() if line.startswith("|") and line.count("`") >= 2]
    return _source(runs) if runs else "unknown run folders"


def _source(runs) -> str:
    return "\n".join(sorted({str(Path(r).resolve()) for r in runs}))


def _output_folder(out, default: Path, inputs, force: bool, kind: str) -> Path:
    """``out`` (or ``default``) checked, made, and recorded as made from ``inputs``: OutputError when it
    holds the ``kind`` of other run folders, unless ``force``."""
    what = "--out" if out else "the default --out"
    folder = paths.folder_out(out if out else default, what)
    run_folder.refuse_inside_a_run(folder, what)
    paths.refuse_inside(folder, inputs, what)
    run_folder.make_folder(folder)
    source, here = made_from(folder), _source(inputs)
    if source and source != here and not force:
        other = "another run folder" if "\n" not in source else "other run folders"
        raise OutputError(f"{folder} holds the {kind} of {other} ({', '.join(source.splitlines())}); choose another "
                          f"--out, or pass --force to overwrite them with those of {', '.join(here.splitlines())}")
    run_folder.atomic_write(folder / MADE_FROM, here + "\n")
    return folder


def figures_folder(run, out, force: bool = False) -> Path:
    """The folder for a run's report and figures (default plots/RUN_NAME): not holding those of
    another run folder (unless ``force``); it then records ``run`` as its source."""
    return _output_folder(out, Path("plots") / Path(run).resolve().name, [run], force, "report or figures")


def matrix_folder(out, scenario: str, runs, force: bool = False) -> Path:
    """A release matrix's folder (default plots/matrix-SCENARIO): not holding the matrix of another set
    of run folders (unless ``force``); it then records ``runs`` as its source."""
    return _output_folder(out, Path("plots") / f"matrix-{scenario}", runs, force, "matrix")


def file_path(out, inputs=(), what: str = "--out") -> Path:
    """A file's path (a findings page, a trace): a regular file or nothing (store.paths.file_out),
    outside every run folder and ``inputs``, in a folder that exists or can be made (by the write)."""
    path = paths.file_out(out, what)
    run_folder.refuse_inside_a_run(path, what)
    paths.refuse_inside(path, inputs, what)
    paths.makeable_folder(path.parent, what)
    return path
