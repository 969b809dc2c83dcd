"""Markdown pieces shared by the published pages and ``compare``: pure functions of pandas tables and
run metadata (no plotting library, so ``swabench compare`` starts without matplotlib)."""

from __future__ import annotations

import shlex
from pathlib import Path, PurePosixPath

import pandas as pd

REPO = Path(__file__).resolve().parents[2]  # the checkout: scenarios/, traces/, results/ as published
KEPT = ("scenarios", "traces", "tests", "results")  # folders of the repository a command may name a file in


def markdown_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(_cell(row[c]) for c in cols) + " |")
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return "" if pd.isna(value) else f"{value:.3g}"
    return str(value)


def short_commit(meta: dict, width: int = 10) -> str:
    """The run's commit, its hash cut to ``width``; a label after it (``fad47f9+brief``, SWABENCH_GIT_COMMIT's
    name for a tree with changes) kept whole."""
    commit, plus, label = (meta.get("git_commit") or "unknown").partition("+")
    return commit[:width] + plus + label


def machine_line(meta: dict) -> str:
    """What a run ran on: the GPU (or CPU), its driver, CUDA, torch and the libraries under test."""
    gpu = meta.get("gpu") or f"CPU ({meta.get('cpu')})"
    return (f"{gpu}, driver {meta.get('nvidia_smi.driver_version', 'n/a')}, CUDA {meta.get('cuda') or 'n/a'}, "
            f"torch {meta.get('torch')}, {library_versions(meta)}")


def code_line(meta: dict, folder: str | None = None) -> str:
    """The code a run ran and how it was started: swabench's version and commit, and the command."""
    return f"swabench {meta.get('swabench')} @ {short_commit(meta)}; `{published_command(meta, folder)}`"


def environment_line(meta: dict, folder: str | None = None) -> str:
    return f"{machine_line(meta)}, {code_line(meta, folder)}"


def published_command(meta: dict, folder: str | None = None) -> str:
    """The run's command as it would be typed to make the folder as published, with no path of the machine
    that ran it: ``--out`` the folder as given (``folder``), a shipped scenario by its name, a file of the
    repository by its path in it, the replayed trace by its hash and steps where it is not in the repository
    (``trace_name``), any other path by its last part in angle brackets."""
    command = meta.get("command") or ""
    try:
        args = shlex.split(command)
    except ValueError:  # a command recorded with an unbalanced quote
        args = command.split()
    words = []
    for i, arg in enumerate(args):
        if folder is not None and i and args[i - 1] == "--out":
            words.append(shlex.quote(folder))
        elif folder is not None and arg.startswith("--out="):
            words.append(f"--out={shlex.quote(folder)}")
        elif arg == (meta.get("trace") or {}).get("file") and not _in_repository(arg):
            words.append(f"<trace: {meta['trace'].get('steps')} steps, sha256 {str(meta['trace'].get('sha256'))[:16]}>")
        else:
            words.append(_without_machine_path(arg))
    return " ".join(words)


def _in_repository(path: str) -> str | None:
    """A path's place in the repository (a shipped scenario by its name), or None where it has none."""
    p = PurePosixPath(path)
    if not p.is_absolute():
        return path
    if p.parent.name == "scenarios" and p.suffix == ".toml" and (REPO / "scenarios" / p.name).is_file():
        return p.stem
    for folder in KEPT:
        if folder in p.parts:
            inside = PurePosixPath(*p.parts[p.parts.index(folder):])
            if (REPO / inside).exists():
                return str(inside)
    return None


def _without_machine_path(arg: str) -> str:
    if not arg.startswith("/"):
        return shlex.quote(arg)
    inside = _in_repository(arg)
    return shlex.quote(inside) if inside else f"<{PurePosixPath(arg).name}>"


def trace_name(trace: dict) -> str:
    """A replayed trace as a sentence names it: 'the trace `traces/example.jsonl`' (its path in the repository),
    or 'a trace not in the repository (sha256 8b72869732cb1307)'."""
    inside = _in_repository(str(trace.get("file", "")))
    if inside:
        return f"the trace `{inside}`"
    return f"a trace not in the repository (sha256 {str(trace.get('sha256'))[:16]})"


def console_summary(table: pd.DataFrame, shown: int = 10, folder: str | None = None) -> str:
    """What a finished sweep prints: points per implementation and status, the median kernel time where any,
    and the first failed, crashed and xpass points (lines starting '  FAIL' / '  CRASH' / '  XPASS'), each followed, where the
    run's ``folder`` is given, by the command that writes its standalone script."""
    from swabench.repro import command

    if not len(table):
        return ""
    counts = table.groupby("impl", sort=False)["status"].value_counts().unstack(fill_value=0)
    if table["median_us"].notna().any():  # a gate-only sweep (check) times nothing
        counts["median of medians (us)"] = table.groupby("impl", sort=False)["median_us"].median().round(1)
    lines = [counts.to_string()]
    for status in ("fail", "crash", "xpass"):
        rows = table[table["status"] == status]
        for _, r in rows.head(shown).iterrows():
            lines.append(f"  {status.upper()} {r['impl']} [{r['backend']}] {r['case']}: {r['reason']}")
            if folder:
                lines.append(f"      reproduce: {command(folder, r['case_id'], r['impl'], r['backend'])}")
        if len(rows) > shown:
            lines.append(f"  {status.upper()} ... and {len(rows) - shown} more (results.csv has them all)")
    return "\n".join(lines)


def library_versions(meta: dict) -> str:
    """'flashinfer 0.7.2.post1' for each library the run recorded ('n/a' where it was not installed)."""
    return ", ".join(f"{name} {version or 'n/a'}" for name, version in (meta.get("libraries") or {}).items())
