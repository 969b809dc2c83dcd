"""One run's REPORT.md for a pull request: its sections (publish.sections) and its figures, made from
the run folder alone, never from hand-typed numbers."""

from __future__ import annotations

from pathlib import Path

from swabench.analysis import derived
from swabench.publish import outputs, sections
from swabench.publish.markdown import environment_line
from swabench.store import tables


def summary(run: sections.Run) -> str:
    """What ``swabench summary`` prints: the summary sections of one run."""
    return "\n\n".join(part for s in sections.on(sections.SUMMARY) for part in s.for_run(run))


def write(run_dir: Path, out: Path) -> Path:
    """REPORT.md and its figures in ``out``, from the run folder alone."""
    from swabench.publish import plots

    run_dir, out = Path(run_dir), Path(out)
    run = sections.Run(str(run_dir), *derived.load(run_dir))
    table, meta = run.table, run.meta
    made = plots.make_all(table, meta, out)
    presets = table["model"].dropna().unique() if "model" in table else []
    parts = [f"# swabench report: {meta.get('scenario')}" + (f", {presets[0]}" if len(presets) == 1 else ""),
             f"Run folder `{run_dir}`; {tables.extent(meta, table)}. "
             f"{environment_line(meta, str(run_dir))}"]
    parts += [part for s in sections.on(sections.REPORT) for part in s.for_run(run)]
    parts.append("## Figures")
    for name, paths in made.items():
        doc = (plots.FIGURES[name].__doc__ or name).strip()
        parts.append(f"![{name}]({paths[0].name})\n\n*{doc}*" if paths else f"*{name}: no points for it in this run.*")
    path = out / "REPORT.md"
    outputs.keep(path, "\n\n".join(parts) + "\n")
    return path
