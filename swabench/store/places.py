"""Where a run folder may go: a new one in a folder that holds no run and lies in none (a run folder keeps only
what its run wrote), made and checked writable before any work, and a folder made for a command removed again when
the command wrote nothing in it.  The run folder itself is ``run_folder``."""

from __future__ import annotations

import atexit
import tempfile
from pathlib import Path

from swabench.store import paths
from swabench.store.schema import LOCK, META, ROWS
from swabench.store.tables import RunFolderError


def make_folder(folder: Path) -> Path:
    """Create ``folder`` (and its parents), or say why it cannot be written."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test.")
        probe.close()
    except OSError as e:
        raise RunFolderError(f"cannot write to {folder}: {e.strerror or e}") from None
    return folder


def refuse_a_run(folder: Path, hint: str = "choose another --out", what: str = "--out", resumable: bool = False) -> None:
    """RunFolderError when ``folder`` already holds something: a run folder holds one run.  Dot
    files (the lock, write probes, atomic-write temporaries) are not a run; ``resumable``: say that
    --resume continues it, where it can (the folder has its journal)."""
    folder = Path(folder)
    if not (folder.is_dir() and any(not p.name.startswith(".") for p in folder.iterdir())):
        return
    if not (folder / META).is_file():
        raise RunFolderError(f"{what} {folder} is not a run folder and is not empty: pick an empty or new folder")
    if resumable and (folder / ROWS).is_file():
        hint = f"pass --resume to continue it, or {hint}"
    elif resumable:
        hint = f"it has no {ROWS} journal to resume (a published run folder); {hint}"
    raise RunFolderError(f"{folder} already holds a run; {hint}")


def check_new_run(folder, what: str = "--out", hint: str = "choose another --out", resumable: bool = False) -> Path:
    """``folder`` as the path of a new run folder: a folder or nothing, not inside another run folder,
    holding no run (RunFolderError, OutputError); checked before any work."""
    folder = paths.folder_out(folder, what)
    refuse_inside_a_run(folder.resolve().parent, what, folder)
    refuse_a_run(folder, hint, what, resumable)
    return folder


def new_folder(root: Path, name: str) -> Path:
    """``root``/``name``, created here and now, or ``name``-2, -3 ... when another process took it (made now,
    so two commands started in the same second never share one); removed at exit if the command wrote nothing
    in it, so a refused command leaves no empty folder behind."""
    refuse_inside_a_run(root, "the default --out", Path(root) / name)
    make_folder(root)
    for n in range(1, 1000):
        folder = Path(root) / (name if n == 1 else f"{name}-{n}")
        try:
            folder.mkdir()
            atexit.register(remove_if_empty, folder)
            return folder
        except FileExistsError:
            continue
        except OSError as e:
            raise RunFolderError(f"cannot create {folder}: {e.strerror or e}") from None
    raise RunFolderError(f"{root}/{name}-2 to -999 are all taken: pass --out")


def remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` when it holds nothing but its lock: a folder made for a command that wrote nothing."""
    try:
        left = list(Path(folder).iterdir())
        if all(p.name == LOCK for p in left):
            for p in left:
                p.unlink()
            Path(folder).rmdir()
    except OSError:  # gone already, or written to since: either way not an empty folder of ours
        pass


def run_folder_above(path) -> Path | None:
    """The run folder (a folder with meta.json) that ``path`` is or lies in; None when there is none."""
    path = Path(path).resolve()
    return next((folder for folder in (path, *path.parents) if (folder / META).is_file()), None)


def refuse_inside_a_run(path, what: str = "--out", named=None) -> None:
    """RunFolderError when writing ``path`` would write into a run folder: a run folder holds the
    files its run wrote, which readers trust, and nothing else (``named``: the path as given, when
    ``path`` is the folder it would be made in)."""
    run = run_folder_above(path)
    if run is not None:
        raise RunFolderError(f"{what} {named or path} is inside the run folder {run}: a run folder keeps only what "
                             f"its run wrote; write outside it")


NOTHING_WRITTEN = "choose another --out (nothing was written)"
