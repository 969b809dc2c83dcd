"""Across library releases: where the findings page holds one scenario run on several releases of a
library, which release has which declared upstream bug, and which got faster or slower (analysis.matrix)."""

from __future__ import annotations

import os
from functools import lru_cache

from swabench.analysis import matrix
from swabench.impls import registry
from swabench.publish.markdown import markdown_table
from swabench.publish.sections.base import FINDINGS, Run, Section, ratio, span


def _release_set_key(r: Run) -> tuple:
    """What a release set holds fixed: the scenario, the cases its command picked (``--case``: a run of some of a
    scenario's groups, on each release, is a set of its own) and the GPU (a release is timed against another on one
    card)."""
    return r.meta.get("scenario"), picked_cases(str(r.meta.get("command") or "")), r.meta.get("gpu")


def picked_cases(command: str) -> tuple[str, ...]:
    """The ``--case`` filters of a recorded command line, sorted.  Lines recorded before they were quoted hold a
    filter's words unquoted: a filter runs to the next option."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    picked, current = [], None
    for word in words:
        if word.startswith("--"):
            current = [] if word == "--case" else None
            if word.startswith("--case="):
                picked.append(word.removeprefix("--case="))
            if current is not None:
                picked.append(current)
        elif current is not None:
            current.append(word)
    return tuple(sorted(" ".join(p) if isinstance(p, list) else p for p in picked))


def named(group: list[Run]) -> str:
    """A release set as the page names it: '`release`', or '`release` (groups tree)' for a part of it."""
    scenario, picked, _ = _release_set_key(group[0])
    stem = os.path.commonprefix(list(picked)) if len(picked) > 1 else ""
    stem = stem[:stem.rfind("-") + 1]  # 'shelf-{blocks,decode}', never 'shelf-{b,d}ecode'
    said = f"{stem}{{{','.join(g[len(stem):] for g in picked)}}}" if stem else ", ".join(picked)
    return f"`{scenario}`" + (f" (groups {said})" if picked else "")


def release_sets(runs: list[Run]) -> list[tuple[str, list[Run]]]:
    """(library, runs) per scenario, the cases its runs picked and the GPU, whose runs were made on two or more releases
    of one library, one run a release (the first given where a release ran twice), oldest release first."""
    sets = []
    for sweep in dict.fromkeys(_release_set_key(r) for r in runs):
        same = [r for r in runs if _release_set_key(r) == sweep]
        for lib in registry.libraries():
            by_release = {}
            for r in same:
                version = (r.meta.get("libraries") or {}).get(lib.name)
                if version:
                    by_release.setdefault(version, r)
            if len(by_release) > 1:
                order = sorted(by_release, key=matrix.version_key)
                sets.append((lib.name, [by_release[v] for v in order]))
    return sets


def older_releases(runs: list[Run]) -> list[Run]:
    """Every run of a release set's scenario made on a release older than its newest, or on a patched build of it: the
    findings page shows them in this section only, so that the other sections read the newest release as released."""
    older = []
    for library, group in release_sets(runs):
        newest = (matrix.newest(group).meta.get("libraries") or {}).get(library)
        older += [r for r in runs if _release_set_key(r) == _release_set_key(group[0])
                  and (r.meta.get("libraries") or {}).get(library) not in (None, newest)]
    return older


@lru_cache(maxsize=8)
def _matrix(folders: tuple[str, ...], library: str) -> matrix.Matrix:
    return matrix.build(list(folders), library)


def matrix_of(library: str, group: list[Run]) -> matrix.Matrix:
    return _matrix(tuple(r.folder for r in group), library)


def unexpected(m: matrix.Matrix) -> dict[str, str]:
    """Per release, what the gate did not expect: correct paths failing outside a declared upstream bug,
    known bugs not caught (xpass); empty where every release is clean."""
    said = {}
    for r in m.releases:
        t = r.table
        fails = t[(t["status"] == "fail")]
        xpass = t[t["status"] == "xpass"]
        if len(fails) or len(xpass):
            said[r.version] = ", ".join(f"{len(x)} {what} ({', '.join(sorted(set(x['impl'])))})"
                                        for x, what in ((fails, "failed"), (xpass, "xpass")) if len(x))
    return said


def in_short(runs: list[Run]) -> list[str]:
    """One line per release set for the Answers: which release has which declared bug, what else went wrong if
    anything, and which releases are slower or faster than the newest (on how many timed points, by how much)."""
    lines = []
    for library, group in release_sets(runs):
        m = matrix_of(library, group)
        versions = [r.version for r in m.releases]
        parts = []
        for _, bug in m.bugs.iterrows():
            has = [v for v in versions if str(bug[v]).startswith("has it")]
            fixed = bug.get("fixed upstream in")
            if not has:  # met and passed on every release: the matrix says so, the answer need not
                continue
            parts.append(f"`{bug['upstream']}` shows on {', '.join(has)}"
                         + (f" (fixed upstream in {fixed})" if fixed and fixed != "not yet" else ""))
        patched = {c.release for c in m.patched}  # a patched build's changes are its verdict's to say
        odd = {v: what for v, what in unexpected(m).items() if v not in patched}
        alike: dict[str, list[str]] = {}
        for v, what in odd.items():
            alike.setdefault(what, []).append(v)
        parts += [f"on {' and '.join(vs)}: {what}" for what, vs in alike.items()]
        parts += [f"{'the patch' if len(m.patched) == 1 else c.release}: {c.line(short=True)}" for c in m.patched]
        for r in (r for r in m.releases if r is not m.newest):
            t = m.timings[m.timings["release"] == r.version]
            shifts = [f"{verdict} on {len(p)}/{len(t)} points ({span(p['ratio'])}x)"
                      for verdict in ("slower", "faster") if len(p := t[t["verdict"] == verdict])]
            if shifts:
                parts.append(f"{r.version} " + ", ".join(shifts))
            if len(t) and not t["verdict"].isin(["slower", "faster"]).any():
                same = int((t["verdict"] == "same").sum())
                parts.append(f"{r.version} the same on {same}/{len(t)} points"
                             + (" (the rest too noisy to tell)" if same < len(t) else ""))
        names = folders_named([str(r.folder) for r in m.releases], versions)
        on = "" if library == "flashinfer" else f"{library} "  # the Answers' heading names FlashInfer
        lines.append(f"- {named(group)} on {on}{versions[0]} to {versions[-1]}: "
                     + "; ".join(parts or ["as declared"]) + f" ({names}).")
    return lines


def folders_named(folders: list[str], versions: list[str]) -> str:
    """'`results/h200-release-{0.7.2.post1,0.7.4}`' where the folders differ only by the release each ran (named at
    their end), else each folder named."""
    stems = {f.removesuffix(v) for f, v in zip(folders, versions)}
    if len(stems) == 1 and all(f.endswith(v) for f, v in zip(folders, versions)):
        return f"`{stems.pop()}{{{','.join(versions)}}}`"
    return ", ".join(f"`{f}`" for f in folders)


def moved(points) -> str:
    """'paged-mask [fa2] (2 points, 1.45-1.95x), ...': the paths of ``points`` with their ratios to the newest."""
    parts = []
    for (impl, backend), p in points.groupby(["impl", "backend"], sort=False):
        lo, hi = ratio(p["ratio"].min()), ratio(p["ratio"].max())
        parts.append(f"`{impl}` [{backend}] ({len(p)} point{'s' * (len(p) != 1)}, {lo if lo == hi else f'{lo}-{hi}'}x)")
    return ", ".join(parts)


def across_releases(runs: list[Run]) -> list[str]:
    said = []
    for library, group in release_sets(runs):
        m = matrix_of(library, group)
        names = ", ".join(f"{r.version} ({f'`{r.folder}`'})" for r in m.releases)
        said.append(f"{named(group)} on {library} {names}:")
        for _, bug in m.bugs.iterrows():
            has = [r.version for r in m.releases if str(bug[r.version]).startswith("has it")]
            clean = [r.version for r in m.releases if str(bug[r.version]).startswith("not shown")]
            said.append(f"- `{bug['upstream']}` ({bug['what']}): " +
                        (f"shown on {', '.join(has)}" if has else "shown on none") +
                        (f"; not shown on {', '.join(clean)}" if clean else "") + ".")
        for r in (r for r in m.releases if r is not m.newest):
            t = m.timings[m.timings["release"] == r.version]
            if not len(t):
                continue
            slower, faster = (t["verdict"] == "slower").sum(), (t["verdict"] == "faster").sum()
            said.append(f"- {r.version} against {t['against'].iloc[0]}: median time ratio {ratio(t['ratio'].median())} "
                        f"over {len(t)} timed points; {slower} slower, {faster} faster, the rest the same within "
                        f"noise" + "".join(f"; {verdict} on {moved(t[t['verdict'] == verdict])}"
                                           for verdict in ("slower", "faster") if (t["verdict"] == verdict).any())
                        + ".")
        said += [f"- Patched: {c.line()}." for c in m.patched]
        said += ["Points per status:", markdown_table(m.statuses)]
        if len(m.bugs):
            said += ["Declared upstream bugs, per release:", markdown_table(m.bugs)]
    return said


TOPIC = "Across releases"

SECTIONS = [
    Section("releases", "Across releases",
            "One scenario run on several releases of a library (`swabench matrix` writes the full matrix and its "
            "figure): the declared upstream bugs each release shows, and each release's kernel times against the "
            "newest's, point by point, by the rule `compare` uses.", pages=frozenset({FINDINGS}),
            across=across_releases, every_release=True),
]
