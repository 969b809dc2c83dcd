"""A bug's fix in ``patches/`` (one unified diff per fix, whose header names the bug it fixes, ``Fixes: REF``, and the
command that gates it, ``Gate: ...``) and the gate's verdict on it, read from the run folders: a run made with that
patch (``meta.json``'s ``patch``, by its sha256) and a run of its base release without a patch, of the same scenario
(``analysis.patched``).  An issue body says the patch and that verdict, in the library's terms (a maintainer runs
no command of this suite's), or that no GPU has checked it yet."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from swabench.publish.outputs import PUBLISHED

PATCHES = Path(__file__).resolve().parents[2] / "patches"  # the repository's; absent from an installed wheel
FIXES = re.compile(r"^Fixes: (\S+)", re.M)


@dataclass(frozen=True)
class Fix:
    name: str  # "patches/flashinfer-4992.diff"
    sha256: str


def for_bug(ref: str, folder: Path = PATCHES) -> Fix | None:
    """The patch in ``folder`` whose header says it fixes ``ref``, or None (a file ``--patch`` would refuse is no
    fix of anything)."""
    from swabench.run import patched_release

    paths = sorted(p for p in folder.iterdir() if p.suffix in (".diff", ".patch")) if folder.is_dir() else []
    for path in paths:
        try:
            patch = patched_release.read(path)
        except patched_release.PatchError:
            continue
        head = patch.text.split("\n--- ", 1)[0]
        said = FIXES.search(head)
        if said and said[1] == ref:
            return Fix(f"{folder.name}/{path.name}", patch.sha256)
    return None


def gated(fix: Fix, root: Path = PUBLISHED, bug: str | None = None) -> list[tuple[str, Path, Path]]:
    """(the gate's verdict on each scenario, the base run, the patched run) for each run folder under ``root`` made
    with ``fix`` beside one of its base release without a patch, of the same scenario; ``bug``: the verdict says that
    bug's rows alone (``analysis.patched.Comparison.line``) and the timed points' change where both ran on one GPU."""
    from swabench.analysis import patched
    from swabench.store import run_folder

    folders = sorted(p for p in root.iterdir() if (p / "meta.json").is_file()) if root.is_dir() else []
    metas = {p: run_folder.read_meta(p) for p in folders}
    found = []
    for folder, meta in metas.items():
        patch = meta.get("patch") or {}
        if patch.get("sha256") != fix.sha256:
            continue
        library = patch.get("library", "flashinfer")
        bases = [p for p, m in metas.items() if not m.get("patch") and m.get("scenario") == meta.get("scenario")
                 and (m.get("libraries") or {}).get(library) == patch.get("base")]
        bases.sort(key=lambda p: metas[p].get("gpu") != meta.get("gpu"))  # the same card first
        if bases:
            base_table, base_meta = run_folder.load(bases[0])
            table, _ = run_folder.load(folder)
            release = (meta.get("libraries") or {}).get(library) or f"{patch.get('base')}+{patch.get('name')}"
            said = patched.compare(patch["base"], base_table, release, table, patch).line(bug)
            if bug is not None:
                said = f"On {meta.get('scenario')}, {said}" + timed(bases[0], folder, base_meta, meta)
            found.append((said, bases[0], folder))
    return found


def timed(base: Path, folder: Path, base_meta: dict, meta: dict) -> str:
    """'; of 64 timed points, 3 slower (up to 1.08x) and 0 faster on one NVIDIA H100 80GB HBM3' by compare's rule,
    where both ran on one GPU; nothing where they did not, or share no point."""
    from swabench.analysis import compare

    if base_meta.get("gpu") != meta.get("gpu"):
        return ""
    try:
        t = compare.compare(base, folder).table.dropna(subset=["base_us", "new_us"])
    except compare.CompareError:
        return ""
    if t.empty:
        return ""
    slower, faster = t[t["verdict"] == "regression"], t[t["verdict"] == "improvement"]
    worst = f" (up to {slower['ratio'].max():.2f}x)" if len(slower) else ""
    return f"; of {len(t)} timed points, {len(slower)} slower{worst} and {len(faster)} faster on one {meta['gpu']}"


def lines(ref: str, folder: Path = PATCHES, root: Path = PUBLISHED) -> list[str]:
    """What an issue body says of ``ref``'s fix: the patch and the gate's verdict on it, or the command that gates it;
    nothing where no patch fixes it."""
    fix = for_bug(ref, folder)
    if fix is None:
        return []
    found = gated(fix, root, ref)
    if found:
        return [f"**A fix, checked on a GPU:** `{fix.name}` (sha256 {fix.sha256[:12]}). " +
                " ".join(f"{said}." for said, _, _ in found)]
    return [f"**A fix:** `{fix.name}` (sha256 {fix.sha256[:12]}), not yet checked on a GPU."]
