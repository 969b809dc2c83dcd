"""Where a report, figures or a findings page may be written: outside every run folder, in a folder
that can be written, and never over the report or figures of another run folder unless asked."""

from __future__ import annotations

from pathlib import Path

from swabench.errors import UserError
from swabench.store import run_folder


class OutputError(UserError):
    pass


MADE_FROM = ".swabench-made-from"  # in a report's or figures' folder: the run folder they were made from


def made_from(folder: Path) -> str | None:
    """The run folder (resolved) ``folder``'s report or figures were made from, when it says."""
    marker = folder / MADE_FROM
    if marker.is_file():
        return marker.read_text().strip() or None
    report = folder / "REPORT.md"
    lines = report.read_text(errors="replace").splitlines() if report.is_file() else []
    named = next((line.split("`")[1] for line in lines if line.startswith("Run folder `")), None)
    return str(Path(named).resolve()) if named else None


def figures_folder(run, out, force: bool = False) -> Path:
    """The folder for a run's report and figures: outside every run folder, writable, and not
    holding those of another run folder (unless ``force``); it then records ``run`` as its source."""
    folder = Path(out) if out else Path("plots") / Path(run).resolve().name
    run_folder.refuse_inside_a_run(folder, "--out" if out else "the default --out")
    run_folder.make_folder(folder)
    source, here = made_from(folder), str(Path(run).resolve())
    if source and source != here and not force:
        raise OutputError(f"{folder} holds the report or figures of another run folder ({source}); choose another "
                         f"--out, or pass --force to overwrite them with those of {here}")
    run_folder.atomic_write(folder / MADE_FROM, here + "\n")
    return folder


def page_path(out) -> Path:
    """A findings page's path: outside every run folder, in a folder that exists (made if missing) and
    can be written."""
    out = Path(out)
    run_folder.refuse_inside_a_run(out)
    run_folder.make_folder(out.parent)
    return out


def matrix_folder(out, scenario: str) -> Path:
    """A release matrix's folder: ``out``, or plots/matrix-SCENARIO; outside every run folder."""
    folder = Path(out) if out else Path("plots") / f"matrix-{scenario}"
    run_folder.refuse_inside_a_run(folder, "--out" if out else "the default --out")
    run_folder.make_folder(folder)
    return folder
