"""Across library releases: where the findings page holds one scenario run on several releases of a
library, which release has which declared upstream bug, and which got faster or slower (analysis.matrix)."""

from __future__ import annotations

from swabench.analysis import matrix
from swabench.impls import registry
from swabench.publish.markdown import markdown_table
from swabench.publish.sections.base import FINDINGS, Run, Section, ratio


def release_sets(runs: list[Run]) -> list[tuple[str, list[Run]]]:
    """(library, runs) per scenario whose runs were made on two or more releases of one library, one run a
    release (the first given where a release ran twice)."""
    sets = []
    for scenario in dict.fromkeys(r.meta.get("scenario") for r in runs):
        same = [r for r in runs if r.meta.get("scenario") == scenario]
        for lib in registry.libraries():
            by_release = {}
            for r in same:
                version = (r.meta.get("libraries") or {}).get(lib.name)
                if version:
                    by_release.setdefault(version, r)
            if len(by_release) > 1:
                sets.append((lib.name, list(by_release.values())))
    return sets


def across_releases(runs: list[Run]) -> list[str]:
    said = []
    for library, group in release_sets(runs):
        m = matrix.build([r.folder for r in group], library)
        names = ", ".join(f"{r.version} ({f'`{r.folder}`'})" for r in m.releases)
        said.append(f"`{m.scenario}` on {library} {names}:")
        for _, bug in m.bugs.iterrows():
            has = [r.version for r in m.releases if str(bug[r.version]).startswith("has it")]
            clean = [r.version for r in m.releases if str(bug[r.version]).startswith("not shown")]
            said.append(f"- `{bug['upstream']}` ({bug['what']}): " +
                        (f"shown on {', '.join(has)}" if has else "shown on none") +
                        (f"; not shown on {', '.join(clean)}" if clean else "") + ".")
        for r in m.releases[:-1]:
            t = m.timings[m.timings["release"] == r.version]
            if not len(t):
                continue
            slower, faster = (t["verdict"] == "slower").sum(), (t["verdict"] == "faster").sum()
            said.append(f"- {r.version} against {m.newest.version}: median time ratio {ratio(t['ratio'].median())} "
                        f"over {len(t)} timed points; {slower} slower, {faster} faster, the rest the same within "
                        f"noise.")
        said += ["Points per status:", markdown_table(m.statuses)]
        if len(m.bugs):
            said += ["Declared upstream bugs, per release:", markdown_table(m.bugs)]
    return said


SECTIONS = [
    Section("releases", "Across releases",
            "One scenario run on several releases of a library (`swabench matrix` writes the full matrix and its "
            "figure): the declared upstream bugs each release shows, and each release's kernel times against the "
            "newest's, point by point, by the rule `compare` uses.", pages=frozenset({FINDINGS}),
            across=across_releases),
]
