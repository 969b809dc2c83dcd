"""A user's runs go where the published runs are not: every default output lands under runs/, which the repository's
.gitignore ignores, so a clone stays clean; the published runs in results/ keep their reports in plots/."""

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import TINY, invoke

from swabench.publish import outputs
from swabench.run import lifecycle

ROOT = Path(__file__).resolve().parents[1]
git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def clone_like(folder: Path) -> Path:
    """A git repository holding the project's .gitignore, committed: what a fresh clone's `git status` sees."""
    folder.mkdir()
    shutil.copy(ROOT / ".gitignore", folder / ".gitignore")
    for command in (["init", "-q"], ["add", ".gitignore"],
                    ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "clone"]):
        subprocess.run(["git", *command], cwd=folder, check=True)
    return folder


def status(folder: Path) -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=folder, check=True,
                          capture_output=True, text=True).stdout


@git
def test_a_run_and_its_report_by_default_leave_a_clone_clean(tmp_path, monkeypatch, write_scenario, one_figure):
    scenario = write_scenario(TINY)
    clone = clone_like(tmp_path / "clone")
    monkeypatch.chdir(clone)
    r = invoke("run", scenario, "--device", "cpu", "--impl", "torch-trim", "--case", "verify")
    assert r.exit_code == 0, r.output
    (run,) = (clone / "runs").iterdir()
    r = invoke("report", run)
    assert r.exit_code == 0 and (clone / "runs" / "plots" / run.name / "REPORT.md").is_file(), r.output
    assert status(clone) == ""


@git
def test_every_default_root_is_ignored_and_the_published_reports_stay_in_plots(tmp_path):
    clone = clone_like(tmp_path / "clone")
    defaults = [lifecycle.RUNS_ROOT / "cpu-run-cpu-20260101-000000", outputs.FIGURES / "cpu-run-cpu-20260101-000000",
                outputs.FIGURES / "matrix-release", lifecycle.RUNS_ROOT / "host-bench-20260101-000000"]
    ignored = subprocess.run(["git", "check-ignore", *map(str, defaults)], cwd=clone, capture_output=True, text=True)
    assert ignored.stdout.split() == list(map(str, defaults))
    assert outputs.figures_root([Path("results") / "h200-default-0.7.4"]) == Path("plots")
    assert outputs.figures_root([Path("results") / "a", tmp_path / "mine"]) == outputs.FIGURES
