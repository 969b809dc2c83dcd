"""A patched release against its base (``swabench run --patch``): which points changed status, and for each bug
whose rows the base got wrong, whether the patch turns them right.

A patched run records its patch in ``meta.json`` (``patch``: its name, sha256, files, and ``base``, the release it was
applied to); the base is the run of that release without a patch.  The points are joined on case, implementation and
backend.  A bug is a declared upstream bug (the ``upstream`` column: its predicted rows are the base's points where
its condition held) or a known-bug implementation (its predicted rows: the base's points where the gate caught it);
its rows turn right where the patched release passes them (``pass``, or ``xpass`` for a known bug: the call that was
wrong is now right).  The verdict line says it in one sentence, for the report and an issue body.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

KEYS = ["case_id", "impl", "backend"]
RIGHT = ("pass", "xpass")  # the gate saw the right answer
WRONG = ("xfail", "fail")  # the gate saw a wrong one


@dataclass
class Comparison:
    release: str  # the patched release's label: "0.7.4+flashinfer-4992"
    base: str  # "0.7.4"
    patch: dict  # meta.json's record of the patch
    points: int  # points both runs gated (a skip on either side is left out)
    changed: pd.DataFrame  # case, impl, backend, the status on each side, the declared bug
    bugs: pd.DataFrame  # per bug: its predicted rows, wrong on the base, right with the patch, the verdict

    def line(self, bug: str | None = None, short: bool = False) -> str:
        """'0.7.4+flashinfer-4992 against 0.7.4: flashinfer#4972: 9 of 9 wrong points right; no other point of the
        82 both ran changed status'; each other point that changed named with its statuses and the gate's reason (the
        first three).  ``bug``: that bug's rows alone (an issue body's); else every declared bug's, and each known
        mistake's where some of its rows turn right.  ``short``: without the releases, the other points counted only
        ('... right; nothing else of 82 points changed')."""
        shown = self.bugs[(self.bugs["kind"] == "upstream") | (self.bugs["right"] > 0)] if bug is None else \
            self.bugs[self.bugs["bug"] == bug]  # a caller's mistake still caught is as expected: not said
        fixed = [f"{b.bug}: {b.right} of {b.wrong} wrong points right" for b in shown.itertuples() if b.wrong]
        if bug is not None and not fixed:
            fixed = [f"{bug}'s rows not met"]
        keys = self.bugs.attrs.get("keys", {})
        bug_keys = {k for b in shown["bug"] for k in keys.get(b, ())}
        others = self.changed[[k not in bug_keys for k in zip(self.changed["case_id"], self.changed["impl"],
                                                              self.changed["backend"])]]
        if short:
            said = f"{len(others)} other of {self.points} points changed ({', '.join(dict.fromkeys(others['impl']))})" \
                if len(others) else f"nothing else of {self.points} points changed"
            return "; ".join(fixed + [said])
        said = f"{len(others)} other point{'s' * (len(others) > 1)} of the {self.points} both ran changed status" \
            if len(others) else f"no other point of the {self.points} both ran changed status"
        if len(others):
            said += " (" + "; ".join(f"{r['impl']} [{r['backend']}] on {r['case']}: {r[self.base]} to {r[self.release]}"
                                     + (f", {r['reason'].split(';')[0]}" if r["reason"] else "")
                                     for _, r in others.head(3).iterrows()) + ")"
        return f"{self.release} against {self.base}: " + "; ".join(fixed + [said])


def compare(base_version: str, base: pd.DataFrame, version: str, patched: pd.DataFrame, patch: dict) -> Comparison:
    """``patched`` (a run's table on the patched release) against ``base`` (on the release it patches)."""
    columns = KEYS + ["case", "kind", "status", "upstream"]
    joined = base.reindex(columns=columns).merge(patched.reindex(columns=KEYS + ["status", "reason"]), on=KEYS,
                                                 suffixes=(" base", " patched"))
    joined = joined[(joined["status base"] != "skip") & (joined["status patched"] != "skip")]
    moved = joined[joined["status base"] != joined["status patched"]]
    changed = pd.DataFrame({"case_id": moved["case_id"], "case": moved["case"], "impl": moved["impl"],
                            "backend": moved["backend"], base_version: moved["status base"],
                            version: moved["status patched"], "declared bug": moved["upstream"].fillna(""),
                            "reason": moved["reason"].fillna("")}).reset_index(drop=True)
    return Comparison(version, base_version, patch, len(joined), changed, _bugs(joined))


def _bugs(joined: pd.DataFrame) -> pd.DataFrame:
    """Per declared upstream bug and known-bug implementation met on the base: its rows, wrong there, right here (a
    known mistake's rows where a declared bug speaks are that bug's)."""
    upstream = joined[joined["upstream"].notna()]
    known = joined[(joined["kind"] == "known-bug") & joined["status base"].isin(WRONG) & joined["upstream"].isna()]
    groups = [(ref, "upstream", g) for ref, g in upstream.groupby("upstream", sort=False)] + \
        [(impl, "known-bug", g) for impl, g in known.groupby("impl", sort=False)]
    rows, keys = [], {}
    for bug, kind, g in groups:
        wrong = g[g["status base"].isin(WRONG)]
        right = int(wrong["status patched"].isin(RIGHT).sum())
        keys[bug] = list(zip(wrong["case_id"], wrong["impl"], wrong["backend"]))
        verdict = "not shown on the base" if not len(wrong) else \
            "turns right" if right == len(wrong) else "partly right" if right else "still wrong"
        rows.append({"bug": bug, "kind": kind, "predicted": len(g), "wrong": len(wrong), "right": right,
                     "verdict": verdict})
    table = pd.DataFrame(rows, columns=["bug", "kind", "predicted", "wrong", "right", "verdict"])
    table.attrs["keys"] = keys  # per bug: the (case_id, impl, backend) of its rows wrong on the base
    return table


def base_of(release, releases):
    """The unpatched run of the release a patched build (``analysis.matrix.Release``) patches, where one is among
    ``releases``; None for an unpatched one."""
    base = (release.meta.get("patch") or {}).get("base")
    return next((r for r in releases if base and r.version == base and not r.meta.get("patch")), None)


def against_bases(releases) -> tuple[list[Comparison], list[str]]:
    """Each patched release of a matrix (``analysis.matrix.Release``) against the unpatched run of its base; a
    warning for one whose base is not among them."""
    found, warnings = [], []
    for r in releases:
        patch = r.meta.get("patch")
        if not patch:
            continue
        base = base_of(r, releases)
        if base is None:
            warnings.append(f"{r.version} ({r.folder}) patches {patch.get('base')}, which no folder here ran without "
                            f"a patch: nothing to set it against")
            continue
        found.append(compare(base.version, base.table, r.version, r.table, patch))
    return found, warnings
