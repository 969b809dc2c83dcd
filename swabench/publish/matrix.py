"""``swabench matrix``: a release matrix (analysis.matrix) as MATRIX.md, matrix.csv and matrix.png."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from swabench.analysis.matrix import Matrix
from swabench.publish.markdown import environment_line, markdown_table

FILES = ("MATRIX.md", "matrix.csv", "matrix.png")


def releases_table(m: Matrix, unbuilt: dict[str, str]) -> pd.DataFrame:
    rows = [{"release": r.version, "run": f"`{r.folder}`", "state": r.meta.get("state", "complete"),
             "points": len(r.table), "library ran": "no: " + r.why_not if r.why_not else "yes"} for r in m.releases]
    rows += [{"release": v, "run": "", "state": "not built", "points": 0, "library ran": "no: " + why}
             for v, why in unbuilt.items()]
    return pd.DataFrame(rows)


def timing_summary(m: Matrix) -> pd.DataFrame:
    """Per release: its timed points' time / the newest's, as median (min-max), and the verdicts."""
    if m.timings.empty:
        return pd.DataFrame()
    rows = []
    for version, g in m.timings.groupby("release", sort=False):
        verdicts = g["verdict"].value_counts()
        rows.append({"release": version, "points": len(g),
                     f"time / {m.newest.version}": f"{g['ratio'].median():.2f} ({g['ratio'].min():.2f}-"
                                                   f"{g['ratio'].max():.2f})",
                     **{v: int(verdicts.get(v, 0)) for v in ("slower", "faster", "same", "too noisy")}})
    return pd.DataFrame(rows)


def timing_points(m: Matrix) -> pd.DataFrame:
    """Each timed point: its time on the newest release, and each older release's time / that."""
    if m.timings.empty:
        return pd.DataFrame()
    t = m.timings.assign(path=m.timings["impl"] + " [" + m.timings["backend"] + "]",
                         cell=[f"{r:.2f}" + ("" if v == "same" else f" {v}") for r, v in
                               zip(m.timings["ratio"], m.timings["verdict"])])
    wide = t.pivot_table(index=["case", "path"], columns="release", values="cell", aggfunc="first", sort=False)
    newest = t.drop_duplicates(["case", "path"]).set_index(["case", "path"])["newest_us"]
    wide.insert(0, f"{m.newest.version} us", newest.reindex(wide.index).round(1))
    return wide.reset_index()


def to_markdown(m: Matrix, unbuilt: dict[str, str], threshold: float, alpha: float) -> str:
    parts = [f"# Release matrix: {m.scenario} on {m.library} "
             + ", ".join(r.version for r in m.releases), "",
             f"Newest release: {environment_line(m.newest.meta, str(m.newest.folder))}", ""]
    parts += [f"- **Warning:** {w}" for w in m.warnings] + ([""] if m.warnings else [])
    parts += ["## Releases", "", markdown_table(releases_table(m, unbuilt)), "",
              "## Points per status", "",
              "Per implementation and release (a path whose API a release lacks skips and names the release; `xfail` "
              "on a correct path is a declared upstream bug):", "", markdown_table(m.statuses), ""]
    if len(m.bugs):
        parts += ["## Declared upstream bugs", "",
                  "Per bug declared in `swabench/impls/upstream.py` and met by the scenario: on how many of the points "
                  "where its condition held each release got it wrong.", "", markdown_table(m.bugs), ""]
    parts += patched_sections(m)
    summary = timing_summary(m)
    if len(summary):
        parts += [f"## Time against {m.newest.version}", "",
                  f"Each point timed on both: that release's median kernel time / {m.newest.version}'s (above 1: "
                  f"that release is slower). A point is slower or faster when |ratio - 1| > max({threshold:g}, "
                  f"the two points' combined noise) and the Mann-Whitney U test on the samples gives p < {alpha:g} "
                  f"(the rule of `swabench compare`); too noisy when either point's IQR / median is above "
                  f"{threshold:g}.", "", markdown_table(summary), "", markdown_table(timing_points(m)), ""]
    return "\n".join(parts)


def patched_sections(m: Matrix) -> list[str]:
    """Per patched release: the gate's verdict on its patch, its bugs' rows, and every point that changed status."""
    if not m.patched:
        return []
    parts = ["## Patched releases", "",
             "Each release run with a patch to its JIT sources (`swabench run --patch`) against the same release "
             "without it: on the points both gated, whether the rows each bug got wrong turn right, and every point "
             "whose status changed.", ""]
    for c in m.patched:
        files = ", ".join(f"`{f}`" for f in c.patch.get("files", []))
        parts += [f"### {c.release} against {c.base}", "",
                  f"Patch `{c.patch.get('file') or c.patch.get('name')}` (sha256 {str(c.patch.get('sha256'))[:12]}, "
                  f"changes {files}). **Verdict:** {c.line()}.", ""]
        if len(c.bugs):
            parts += [markdown_table(c.bugs), ""]
        parts += [markdown_table(c.changed.drop(columns=["case_id"])) if len(c.changed) else
                  "No point changed status.", ""]
    return parts


def to_csv(m: Matrix) -> str:
    """Every point of every release: its status, declared bug and time, with its ratio to the newest."""
    keys = ["case", "impl", "backend"]
    frames = [r.table.reindex(columns=["case_id", "case", "impl", "kind", "backend", "status", "upstream", "reason",
                                       "median_us", "noise"]).assign(release=r.version) for r in m.releases]
    points = pd.concat(frames, ignore_index=True)
    if not m.timings.empty:
        points = points.merge(m.timings[[*keys, "release", "ratio", "p", "verdict"]], on=[*keys, "release"], how="left")
        points = points.rename(columns={"ratio": "ratio_to_newest"})
    return points.to_csv(index=False)


def figure(m: Matrix, out: Path) -> Path | None:
    """Each timed point's time / the newest release's, against the release (log scale; hollow: the
    same within noise; a colour and marker per implementation, a line style per backend)."""
    if m.timings.empty:
        return None
    import matplotlib.ticker

    from swabench.publish import style

    order = [r.version for r in m.releases]
    fig, axes = style.figure(m.newest.meta, f"{m.scenario}: time / {m.newest.version}, per release")
    ax = axes[0][0]
    t = m.timings.assign(path=m.timings["impl"] + " [" + m.timings["backend"] + "] " +
                         m.timings["case"].str.split().str[0])
    impls = list(dict.fromkeys(t["impl"]))
    for (path, case), g in t.groupby(["path", "case"], sort=False):
        path_look = style.look(g["impl"].iloc[0])
        colour, marker = path_look["color"], path_look["marker"]
        references = {order.index(v) for v in g["against"]}  # the newest; a patched build's base
        points = sorted([(order.index(v), r, verdict) for v, r, verdict in zip(g["release"], g["ratio"], g["verdict"])]
                        + [(x, 1.0, "same") for x in references])
        x, y, verdicts = (list(column) for column in zip(*points))
        ax.plot(x, y, style.BACKEND_STYLE.get(g["backend"].iloc[0], "-"), color=colour, alpha=0.5, lw=1)
        for xi, yi, verdict in zip(x, y, verdicts):
            ax.plot(xi, yi, marker, color=colour, mfc="none" if verdict == "same" else colour)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    if hi / lo < 10:  # within a decade a log axis labels only its bases: label even steps instead
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(8, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.3g"))  # 1.05 and 1.1 apart
    ax.set_xticks(range(len(order)), order)
    ax.set_xlim(-0.5, len(order) - 0.5)
    ax.set_xlabel(f"{m.library} release")
    ax.set_ylabel(f"kernel time / {m.newest.version}")
    for impl in impls:
        ax.plot([], [], ls="none", label=impl, **style.look(impl))
    for b in dict.fromkeys(t["backend"]):
        if b in style.BACKEND_STYLE:
            ax.plot([], [], style.BACKEND_STYLE[b], color="grey", label=b)
    style.legend_outside(fig, axes)
    return style.save(fig, out, "matrix")[0]


def write(m: Matrix, out: Path, unbuilt: dict[str, str], threshold: float, alpha: float) -> list[Path]:
    from swabench.publish.outputs import keep

    out.mkdir(parents=True, exist_ok=True)
    written = [out / "MATRIX.md", out / "matrix.csv"]
    keep(written[0], to_markdown(m, unbuilt, threshold, alpha))
    keep(written[1], to_csv(m))
    png = figure(m, out)
    return written + ([png] if png else [])
