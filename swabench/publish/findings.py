"""The findings page: what a set of run folders shows, made from the folders alone so that no number on it
was ever typed in.  The page itself opens with the decision table an engine builder reads first, then holds the
answers a reader comes for, the runs and a link to each topic; each topic (publish.sections.TOPICS) has a page of
its own in findings/ beside it, written by the same command from the same runs, which the answers link for their
detail.  Every page ends with the command that made it and the run folders it read.

Every number names the folder it comes from: a sentence ends with the folder, a table either has the
folder in each row or sits directly under a "From `folder`:" line."""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path

from swabench.analysis import derived
from swabench.publish import outputs, sections
from swabench.publish.sections import Run
from swabench.publish.sections.base import TOPICS_FOLDER
from swabench.store import paths, places, tables

_LINK = re.compile(r"\]\((?![a-z]+:|#|/|\.\./)")  # a link relative to the page's folder, which a topic page sits below
MADE_BY = outputs.FINDINGS_END  # the last section of every page this module writes begins so


def load(run_dirs) -> list[Run]:
    """The runs, each named as given (RunFolderError for a folder that is not a run, or one given twice)."""
    tables.each_once(run_dirs)
    return [Run(str(Path(d)), *derived.load(d)) for d in run_dirs]


def pages(runs: list[Run], out: str | None = None, index_name: str = "FINDINGS.md") -> dict[str, str]:
    """The page (key '') and each topic's page with something to say (key: its file name under findings/), each
    ending with the command that writes them to ``out`` (printed, without it)."""
    older = {id(r) for r in sections.older_releases(runs)}
    newest = [r for r in runs if id(r) not in older]

    def parts(modules) -> list[str]:
        return [part for s in sections.on(sections.FINDINGS, modules)
                for part in s.for_runs(runs if s.every_release else newest) if part]

    made = made_by(runs, out)
    topics = {m: parts((m,)) for m in sections.TOPICS}
    topics = {m: body for m, body in topics.items() if body}
    links = [f"- [{m.TOPIC}]({TOPICS_FOLDER}/{sections.topic_name(m)}.md)" for m in topics]
    index = ["# Findings"] + parts((sections.decisions,)) + [
        "Every number names the run folder it comes from. The answers come first; each links its topic, whose page "
        "holds the tables and sentences behind it."] + parts((sections.answers,))
    index += (["## Topics", "\n".join(links)] if links else []) + parts((sections.runs,)) + made
    written = {"": "\n\n".join(index) + "\n"}
    for m, body in topics.items():
        head = [f"# {m.TOPIC}", f"Part of [the findings]({'../' + index_name}): every number names the run "
                                f"folder it comes from."]
        text = "\n\n".join(head + body + made) + "\n"
        written[f"{sections.topic_name(m)}.md"] = _LINK.sub("](../", text)
    return written


def made_by(runs: list[Run], out: str | None) -> list[str]:
    """The end of every page: the command that made it, with the run folders it read one a line."""
    words = ["swabench findings", *(shlex.quote(r.folder) for r in runs)]
    words += [f"--out {shlex.quote(out)}"] if out else []
    return [f"{MADE_BY} from these run folders alone: do not edit by hand; run the command again.",
            "```\n" + " \\\n    ".join(words) + "\n```"]


def page(runs: list[Run]) -> str:
    """Every page in one text, the findings page first (what ``swabench findings`` prints without --out)."""
    return "\n".join(pages(runs).values())


_OWNER = re.compile(r"^Part of \[the findings\]\(\.\./(.+?)\): ", re.M)


def _made_for(path: Path) -> str | None:
    """What a page this module wrote (``outputs.ours``: its folder's record lists it as it is) is, by its content:
    '' for a findings page, the file name of its findings page for a topic page; None for any other file."""
    if not outputs.findings_page(path) or not outputs.ours(path):
        return None
    found = _OWNER.search(outputs.first_bytes(path).decode(errors="replace"))
    return found[1] if found else ""


def _replaceable(path: Path, page: str, topic: bool, force: bool) -> None:
    """OutputError when ``path`` exists and is not a findings page or (``topic``) one of the topic pages of ``page``,
    unless ``force``: a findings page replaces neither a user's file nor another findings page's topics."""
    if not path.is_file() or force:
        return
    made = _made_for(path)
    if made is None:
        raise paths.OutputError(f"--out: {path} exists and is not a findings page swabench wrote (the "
                                f"{outputs.MADE_FROM} record beside it does not list it as it is); give another "
                                f"--out, or pass --force to replace it")
    if not topic and made:
        raise paths.OutputError(f"--out: {path} is a topic page of the findings page {made}, not a findings page; "
                                f"give another --out, or pass --force to replace it")
    if topic and made != page:
        whose = f"a topic page of the findings page {made}" if made else "a findings page"
        raise paths.OutputError(f"--out {page}: {path} is {whose} beside it; write {page} in another folder, or "
                                f"pass --force to replace it")


def write(run_dirs: list[Path], out: Path, force: bool = False) -> list[Path]:
    """The findings page at ``out`` and its topic pages in findings/ beside it, from ``run_dirs``; a file that is
    no findings page is replaced only with ``force``, and its own topic page the runs no longer fill
    is removed (a regular file only: never a link)."""
    runs = load(run_dirs)
    out = Path(out)
    folder = out.parent / TOPICS_FOLDER
    if out.resolve() == folder.resolve():
        raise paths.OutputError(f"--out {out}: its topic pages go in {folder}/; name the page otherwise "
                                f"(e.g. FINDINGS.md)")
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise paths.OutputError(f"--out {out}: its topic pages go in {folder}/, which exists and is not a folder; "
                                f"move it or write the page elsewhere")
    written = pages(runs, str(out), out.name)
    targets = {name: (folder / name if name else out) for name in written}
    for path in targets.values():
        if os.path.lexists(path) and not stat.S_ISREG(path.lstat().st_mode):
            raise paths.OutputError(f"--out {out}: {path} exists and is not a regular file; move it first")
    for name, path in targets.items():
        _replaceable(path, out.name, bool(name), force)
    stale = [p for p in folder.glob("*.md") if p.name not in written and stat.S_ISREG(p.lstat().st_mode)
             and _made_for(p) == out.name] if folder.is_dir() else []
    if len(written) > 1:
        places.make_folder(folder)
    for name, text in written.items():
        outputs.keep(targets[name], text, start=True)
    for path in stale:
        path.unlink()
    return list(targets.values())
