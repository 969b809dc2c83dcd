"""What every published section shares: a run as the pages see it, the declaration of a section,
the thresholds the pages hold numbers to, and how numbers read in a sentence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from swabench.analysis.noise import LONG_US, NOISE  # noqa: F401  (the bar a timed point is held to)
from swabench.core.cases import MODES
from swabench.impls import registry
from swabench.publish.markdown import markdown_table
TIE = NOISE  # a ratio within the noise bar of 1 is the same time, not a win or a loss
FLOOR = "its roofline floor / its time"  # a column: the floor at the GPU's peak clocks / the path's time, in percent
REPORT, FINDINGS, SUMMARY = "report", "findings", "summary"  # the pages a section can appear on


@dataclass
class Run:
    folder: str  # as given on the command line: the name every number on a page carries
    table: pd.DataFrame
    meta: dict

    @property
    def name(self) -> str:
        return f"`{self.folder}`"

    @property
    def profiled(self) -> bool:
        """Whether the run was made under a profiler (``swabench profile``: its kernel tables are there)."""
        from swabench.store import run_folder, schema

        return "counters" in self.meta or \
            any(run_folder.stored(self.folder, name).exists() for name in schema.PROFILER_TABLES)

    @property
    def timed(self) -> bool:
        """Whether any point of the run has a kernel time (a check has none)."""
        return bool(len(self.table)) and not self.table["median_us"].isna().all()

    def without_trees(self) -> Run:
        """The run without the points whose verify block is declared a tree (a chain among them): what the sections
        that compare steps of one shape read."""
        if "tree" not in self.table or self.table["tree"].isna().all():
            return self
        return Run(self.folder, self.table[self.table["tree"].isna()], self.meta)


def _nothing(run: Run) -> pd.DataFrame:
    return pd.DataFrame()


def _silent(run: Run) -> list[str]:
    return []


@dataclass(frozen=True)
class Section:
    """One published table, declared once: its title and caption, the table it makes of a run, the
    sentences the findings page says above it, and the pages it appears on.  ``across`` makes the
    whole findings section from every run at once instead (a comparison between runs)."""

    key: str
    title: str | Callable[[], str]
    caption: str | Callable[[], str]
    table: Callable[[Run], pd.DataFrame] = _nothing
    said: Callable[[Run], list[str]] = _silent
    pages: frozenset[str] = frozenset({REPORT, FINDINGS})
    one_table: bool = False  # findings: every run's rows in one table, with the run in its first column
    timed: bool = False  # only runs with kernel times have it
    across: Callable[[list[Run]], list[str]] | None = None
    every_release: bool = False  # findings: also the runs of a scenario made on older releases of a library
    profiled: bool = False  # findings: also the runs made under a profiler, whose tracing lengthens every call
    trees: bool = False  # whether it reads draft-tree verify blocks (Case.tree); the others see each run without

    def head(self) -> list[str]:
        title, caption = (x() if callable(x) else x for x in (self.title, self.caption))
        return [f"## {title}"] + ([caption] if caption else [])

    def for_run(self, run: Run) -> list[str]:
        """The section on one run's report: nothing where the run has no rows for it."""
        run = run if self.trees else run.without_trees()
        if self.timed and not run.timed:
            return []
        frame, said = self.table(run), [s for s in self.said(run) if s]
        return self.head() + said + [markdown_table(frame)] if len(frame) else []

    def for_runs(self, runs: list[Run]) -> list[str]:
        """The section on the findings page: each run's sentences and table under a line naming its folder
        (or one table of every run's rows); nothing where no run has anything for it."""
        runs = [r if self.trees else r.without_trees() for r in runs]
        runs = [r for r in runs if (r.timed or not self.timed) and (self.profiled or not r.profiled)]
        if self.across:
            body = self.across(runs)
        elif self.one_table:
            frames = [self.table(r) for r in runs]
            rows = [f.assign(run=r.name)[["run", *f.columns]] for r, f in zip(runs, frames) if len(f)]
            body = [s for r in runs for s in self.said(r) if s] + ([markdown_table(pd.concat(rows))] if rows else [])
        else:
            body = []
            for r in runs:
                frame = self.table(r)
                body += [s for s in self.said(r) if s] + ([f"From {r.name}:", markdown_table(frame)] if len(frame) else [])
        return self.head() + body if body else []


TOPICS_FOLDER = "findings"  # the findings page's topic pages sit in this folder beside it


def topic_name(module) -> str:
    """A topic's page name under findings/: its module's name ('trees' for sections.trees, or its __name__)."""
    return getattr(module, "__name__", module).rsplit(".", 1)[1]


def topic_link(module, words: str = "detail") -> str:
    """A link from the findings page to a topic's page."""
    return f"[{words}]({TOPICS_FOLDER}/{topic_name(module)}.md)"


FIGURES = "plots"  # results/RUN's report and figures are published in plots/RUN/, beside results/


def figure_link(run: Run, name: str) -> str:
    """A Markdown image of the run's published figure ``name``, as the findings page at the repository's root
    (beside results/ and plots/) links it; '' where the run's report has not been published there."""
    from pathlib import Path

    folder = Path(run.folder)
    link = Path(FIGURES) / folder.name / f"{name}.png"
    return f"![{name}]({link.as_posix()})" if (folder.parent.parent / link).is_file() else ""


def run_for_step(runs: list[Run], mode: str) -> Run | None:
    """The run that speaks for a step on the findings page: of those that timed the step's reference path, the one
    with the most timed points of it whose verify block is no draft tree (the first given on a tie); None where no
    run timed it."""
    def chains(t: pd.DataFrame) -> pd.Series:
        return t["tree"].isna() if "tree" in t else pd.Series(True, index=t.index)

    def timed_reference(t: pd.DataFrame) -> bool:
        refs = {registry.reference_path(s) for s in set(t["storage"])} - {None}
        return any((i, b) in refs for i, b in zip(t["impl"], t["backend"]))

    steps = [(r.table[(r.table["mode"] == mode) & r.table["median_us"].notna() & chains(r.table)], -i, r)
             for i, r in enumerate(runs) if r.timed]
    timed = [(len(step) if timed_reference(step) else 0, i, r) for step, i, r in steps]
    best = max(timed, key=lambda x: x[:2], default=None)
    return best[2] if best and best[0] else None


def mode_order(column: pd.Series) -> pd.Series:
    """Sort key: modes in the order a server meets them, spans windows first (by size), any other column as it is."""
    from swabench.analysis.derived import span_order

    if column.name in ("span", "window (keys)"):
        return column.map(lambda v: span_order(str(v)))
    order = {m: i for i, m in enumerate(MODES)}
    return column.map(order) if column.name == "mode" else column


def span_words(value: str) -> str:
    """A span in a sentence: 'window 1024', 'chunk 8192', 'no window'."""
    return f"window {value}" if value.isdigit() else "no window" if value == "none" else value


def path_of(t: pd.DataFrame) -> pd.Series:
    """Each row's path as the pages name it: 'impl [backend]'."""
    return t["impl"].astype(str) + " [" + t["backend"].astype(str) + "]"


def declared_upstream(t: pd.DataFrame) -> pd.Series:
    """Each row's declared upstream bug, where one spoke on it (the sweep's ``upstream`` column), else NaN."""
    return t["upstream"] if "upstream" in t else pd.Series(float("nan"), index=t.index, dtype=object)


def own_mistake_caught(t: pd.DataFrame) -> pd.Series:
    """The rows where a path's own mistake was caught: xfail, and no declared upstream bug spoke there (on a
    known-bug path an upstream bug can, where its own mistake does not show)."""
    return (t["status"] == "xfail") & declared_upstream(t).isna()


def path_order(path: str) -> tuple:
    """Sort key of 'impl [backend]': registration order, then the backend."""
    return registry.order(path.split(" [")[0]), path


def ratio(x: float) -> str:
    """Three significant digits without an exponent (0.59, 5.67, 31.4, 9206)."""
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def micros(x: float) -> str:
    """A time in microseconds, three significant digits without an exponent (16.9, 216, 1047)."""
    return f"{x:.3g}" if x < 1000 else f"{x:.0f}"


def extent(lo: str, hi: str, between: str = "-") -> str:
    """'lo-hi' (or 'lo to hi'), said once where the two ends read the same."""
    return lo if lo == hi else f"{lo}{between}{hi}"


def ranged(values: pd.Series, words=None) -> str:
    """The least and the most of ``values`` in ``words`` (``ratio`` unless given): '0.99-1.07', or '1.00' once."""
    words = words or ratio
    return extent(words(values.min()), words(values.max()))


def span(values: pd.Series) -> str:
    return extent(ratio(values.min()), ratio(values.max()), " to ")


def spread(ratios: pd.Series) -> str:
    """'1.07x' for one value, else 'median (best-worst, n)', or 'median (each of n)' where best and worst read the
    same."""
    if len(ratios) == 1:
        return f"{ratio(ratios.iloc[0])}x"
    lo, hi = ratio(ratios.min()), ratio(ratios.max())
    return f"{ratio(ratios.median())}x ({f'{lo}-{hi}, ' if lo != hi else 'each of '}{len(ratios)})"


def merged(said: list[tuple[str, Run]], most: int | None = None) -> list[str]:
    """Sentences said of several runs, each once, ending with every run it was said of: 'X (`a`, `b`).'; past
    ``most`` runs, the first and a count: 'X (`a` and 3 more runs, each named in the detail).'"""
    runs_of: dict[str, list[str]] = {}
    for text, run in said:
        runs_of.setdefault(text, []).append(run.name)
    named = {text: list(dict.fromkeys(names)) for text, names in runs_of.items()}
    return [f"{text} ({', '.join(names)})." if most is None or len(names) <= most else
            f"{text} ({names[0]} and {len(names) - 1} more runs, each named in the detail)."
            for text, names in named.items()]


def folded(said: list[tuple[str, str]]) -> list[str]:
    """One line per thing said, naming every subject it was said of: '- `a`, `b`: text', in the order first said."""
    subjects: dict[str, list[str]] = {}
    for subject, text in said:
        subjects.setdefault(text, []).append(subject)
    return [f"- {', '.join(names)}: {text}" for text, names in subjects.items()]


def points(n: int) -> str:
    return f"{n} point" + "s" * (n != 1)


def of(part: int, whole: int, noun: str = "point") -> str:
    """'3 of 8 points', 'all 4 points', 'its one point': a count out of a whole as a person says it."""
    if whole == 1:
        return f"its one {noun}" if part == 1 else f"none of its one {noun}"
    return f"all {whole} {noun}s" if part == whole else f"{part} of {whole} {noun}s"
