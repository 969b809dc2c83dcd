"""The release matrix: runs of one scenario, each made on another release of a library, side by side.

Three tables come out of it: the points per status of each implementation on each release (a path
whose API a release lacks is a skip that names the release); the timed points of each release as a
ratio to the newest release's, judged by the rule ``compare`` uses (each point's own noise and a
Mann-Whitney U test on the samples); and the declared upstream bugs (``impls.upstream``) each release
shows.  A release whose runs could not run the library at all says why in its row.  A patched release (a run of
``swabench run --patch``, named ``BASE+NAME``) is also set against its base (``analysis.patched``): which points
changed status, and whether each bug's wrong rows turn right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from swabench.analysis import compare
from swabench.analysis import patched as patching
from swabench.errors import UserError
from swabench.store import run_folder, tables


class MatrixError(UserError, ValueError):
    """Folders that do not make a release matrix: the CLI exits 2."""


@dataclass
class Release:
    version: str
    folder: Path
    meta: dict
    table: pd.DataFrame
    why_not: str | None = None  # the reason every point of the library skipped, where one reason did


@dataclass
class Matrix:
    library: str
    scenario: str
    releases: list[Release]  # oldest first
    statuses: pd.DataFrame  # impl x release: points per status
    timings: pd.DataFrame  # one row per timed point x release: its time, ratio to the newest, verdict
    bugs: pd.DataFrame  # declared bug x release: points where its condition held, and where it showed
    warnings: list[str] = field(default_factory=list)
    patched: list = field(default_factory=list)  # analysis.patched.Comparison: each patched release against its base

    @property
    def newest(self) -> Release:
        return newest(self.releases)


def newest(releases: list[Release]) -> Release:
    """The newest release as published, the one every other is timed against but a patched build (BASE+NAME), which
    sorts after its base and is timed against it (``patched.base_of``)."""
    plain = [r for r in releases if not r.meta.get("patch")]
    return (plain or releases)[-1]


def version_key(version: str):
    """Releases in release order (0.6.10 after 0.6.9, 0.7.2.post1 after 0.7.2)."""
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(version), "")
    except InvalidVersion:
        return (1, None, version)


def build(folders, library: str = "flashinfer", threshold: float = 0.05, alpha: float = 0.01,
          unbuilt=()) -> Matrix:
    """The matrix of ``folders`` (one scenario, one release of ``library`` each); MatrixError, before
    anything is written, where they do not make one (``unbuilt``: the releases said not to have been
    built, which no folder may have run)."""
    from swabench.impls import registry

    compare.validate(threshold, alpha)
    under_test = [lib.name for lib in registry.libraries()]
    if library not in under_test:
        raise MatrixError(f"--library {library}: not a library under test (a run records the release of those "
                          f"alone); allowed: {', '.join(under_test)}")
    try:
        tables.each_once(folders)
    except tables.RunFolderError as e:
        raise MatrixError(str(e)) from None
    releases = [_release(Path(f), library) for f in folders]
    if len(releases) < 2:
        raise MatrixError("give two run folders or more: one scenario run on different releases")
    scenarios = {r.meta.get("scenario") for r in releases}
    if len(scenarios) > 1:
        raise MatrixError(f"the folders ran different scenarios ({', '.join(sorted(map(str, scenarios)))}): a "
                          f"matrix holds one scenario across releases")
    seen: dict[str, Path] = {}
    for r in releases:
        if r.version in seen:
            raise MatrixError(f"{seen[r.version]} and {r.folder} both ran {library} {r.version}: one folder per "
                              f"release")
        seen[r.version] = r.folder
    ran = {version_key(r.version): r for r in releases}
    for version in unbuilt:
        r = ran.get(version_key(version))
        if r:
            raise MatrixError(f"--unbuilt {version}: {r.folder} ran {library} {r.version}, so it was built; a release "
                              f"is run or not built, not both")
    releases.sort(key=lambda r: version_key(r.version))
    warnings = []
    gpus = {r.meta.get("gpu") for r in releases}
    if len(gpus) > 1:
        warnings.append(f"the runs were made on different devices ({', '.join(sorted(map(str, gpus)))}): their "
                        f"times are not comparable")
    hashes = {r.meta.get("scenario_sha256") for r in releases}
    if len(hashes) > 1:
        warnings.append("the scenario file differs between runs: only the points in both are set side by side")
    comparisons, unmatched = patching.against_bases(releases)
    return Matrix(library, scenarios.pop(), releases, _statuses(releases, library),
                  _timings(releases, threshold, alpha), _bugs(releases), warnings + unmatched, comparisons)


def _release(folder: Path, library: str) -> Release:
    try:
        meta = run_folder.read_meta(folder)
        table = run_folder.to_table(run_folder.read_rows(folder))
    except run_folder.RunFolderError as e:
        raise MatrixError(str(e)) from None
    version = (meta.get("libraries") or {}).get(library)
    if not version:
        raise MatrixError(f"{folder}: the run recorded no {library} release (meta.json libraries.{library} is "
                          f"empty: {library} was not installed where it ran)")
    own = table[table["library"] == library]
    reasons = own["reason"].dropna().unique() if len(own) and (own["status"] == "skip").all() else []
    why_not = reasons[0] if len(reasons) == 1 else None
    return Release(str(version), folder, meta, table, why_not)


def _statuses(releases: list[Release], library: str) -> pd.DataFrame:
    """Per implementation (the library's paths first), per release: 'n pass, n xfail, ...'."""
    columns = {}
    for r in releases:
        counts = r.table.groupby("impl", sort=False)["status"].value_counts().unstack(fill_value=0)
        columns[r.version] = {impl: ", ".join(f"{int(row[s])} {s}" for s in ("pass", "xfail", "fail", "crash", "xpass", "skip")
                                              if s in row and row[s]) for impl, row in counts.iterrows()}
    impls = list(dict.fromkeys(i for r in releases for i in r.table["impl"]))
    kinds = {i: k for r in releases for i, k in zip(r.table["impl"], r.table["kind"])}
    out = pd.DataFrame({"impl": impls, "kind": [kinds[i] for i in impls],
                        **{v: [columns[v].get(i, "not run") for i in impls] for v in columns}})
    return out


def _timings(releases: list[Release], threshold: float, alpha: float) -> pd.DataFrame:
    """Every point timed on the newest release and on another, as that release's time / the newest's,
    with compare's verdict from the newest release's side: slower, faster, same, too noisy."""
    latest = newest(releases)
    words = {"regression": "slower", "improvement": "faster"}
    frames = []
    for r in (r for r in releases if r is not latest):
        reference = patching.base_of(r, releases) or latest  # a patched build against its base
        c = compare.compare(reference.folder, r.folder, threshold, alpha, allow_different_gpus=True)
        t = c.table.dropna(subset=["base_us", "new_us"])
        frames.append(pd.DataFrame({"case": t["case"], "impl": t["impl"], "backend": t["backend"], "release": r.version,
                                    "against": reference.version, "us": t["new_us"], "newest_us": t["base_us"],
                                    "ratio": t["ratio"], "p": t["p"],
                                    "verdict": t["verdict"].map(lambda v: words.get(v, v))}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _bugs(releases: list[Release]) -> pd.DataFrame:
    """Per declared upstream bug met in any run, per release: where it showed / where its condition held."""
    from swabench.impls import upstream

    refs = list(dict.fromkeys(ref for r in releases for ref in r.table["upstream"].dropna()))
    rows = []
    for ref in refs:
        bug = upstream.get(ref)
        row = {"upstream": ref, "what": bug.summary if bug else "(not declared in this swabench)",
               "fixed upstream in": (bug.fixed_in or "not yet") if bug else ""}
        for r in releases:
            met = r.table[r.table["upstream"] == ref]
            ran = met[met["status"] != "skip"]
            shown = int((ran["status"] == "xfail").sum())
            row[r.version] = "not met" if not len(ran) else \
                f"has it ({shown}/{len(ran)} points)" if shown else f"not shown ({len(ran)} points pass)"
        rows.append(row)
    return pd.DataFrame(rows)
