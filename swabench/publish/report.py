"""One run's REPORT.md for a pull request: its sections (publish.sections) and its figures, made from
the run folder alone, never from hand-typed numbers.  A run made without a GPU says its times are host wall time
and reports no method of a GPU's (NVML's clocks), which it never measured; noisy points are listed where the
timings are."""

from __future__ import annotations

from pathlib import Path

from swabench.analysis import derived, noise
from swabench.publish import outputs, sections
from swabench.publish.markdown import environment_line, markdown_table
from swabench.store import tables

GPU_METHOD = ("clocks",)  # meta.json's method rows that say how a GPU was measured
NOISY_SHOWN = 20  # the noisiest points the report lists; it counts the rest
HOST_TIME = ("Times are host wall time: PyTorch code on the CPU timed around each call (this run had no GPU), not "
             "GPU kernel time; where a table or figure says kernel time, read host wall time.")


def on_a_gpu(meta: dict) -> bool:
    return bool(meta.get("gpu")) or str(meta.get("device", "")).startswith("cuda")


def as_measured(meta: dict) -> dict:
    """``meta`` as the report tells it: a run without a GPU keeps no method row of a GPU's."""
    if on_a_gpu(meta):
        return meta
    return {**meta, "method": {k: v for k, v in meta.get("method", {}).items() if k not in GPU_METHOD}}


def summary(run: sections.Run) -> str:
    """What ``swabench summary`` prints: the summary sections of one run."""
    return "\n\n".join(part for s in sections.on(sections.SUMMARY) for part in s.for_run(run))


def noisy_points(run: sections.Run) -> list[str]:
    """The noisy timed points (analysis.noise), the noisiest first, under a line that says how many and what it
    means; nothing where none is."""
    found = noise.noisy(run.table)
    if not len(found):
        return []
    shown = found.head(NOISY_SHOWN)
    said = noise.warning(run.table) or (
        f"{len(found)} of {len(noise.held(run.table))} timed points of {noise.LONG_US} us or more are noisy (IQR / "
        f"median above {noise.NOISE:.0%}): their medians, and the speedups made of them, are not to be trusted")
    said += f". The {len(shown)} noisiest:" if len(shown) < len(found) else "."
    table = shown[["case", "impl", "backend", "median_us", "noise", "repeats"]].rename(
        columns={"median_us": "median us", "noise": "noise (IQR / median)"})
    return ["## Noisy points", said, markdown_table(table)]


def write(run_dir: Path, out: Path) -> Path:
    """REPORT.md and its figures in ``out``, from the run folder alone."""
    from swabench.publish import plots

    run_dir, out = Path(run_dir), Path(out)
    table, meta = derived.load(run_dir)
    run = sections.Run(str(run_dir), table, as_measured(meta))
    made = plots.make_all(table, meta, out)
    presets = table["model"].dropna().unique() if "model" in table else []
    parts = [f"# swabench report: {meta.get('scenario')}" + (f", {presets[0]}" if len(presets) == 1 else ""),
             f"Run folder `{run_dir}`; {tables.extent(meta, table)}. "
             f"{environment_line(meta, str(run_dir))}"]
    if not on_a_gpu(meta):
        parts.append(HOST_TIME)
    for s in sections.on(sections.REPORT):
        parts += s.for_run(run)
        if s.key == "timings" and run.timed:
            parts += noisy_points(run)
    parts.append("## Figures")
    if not on_a_gpu(meta):
        parts.append(HOST_TIME)
    for name, paths in made.items():
        doc = (plots.FIGURES[name].__doc__ or name).strip()
        parts.append(f"![{name}]({paths[0].name})\n\n*{doc}*" if paths else f"*{name}: no points for it in this run.*")
    path = out / "REPORT.md"
    outputs.keep(path, "\n\n".join(parts) + "\n")
    return path
