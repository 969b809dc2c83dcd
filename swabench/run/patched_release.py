"""A library release with a patch to its JIT sources (``swabench run SCENARIO --patch FILE.diff``), set up before
anything imports the library.

FlashInfer compiles its kernels from the headers and Python its package ships (``flashinfer/jit/env.py``: the include
and csrc folders are ``data/include`` and ``data/csrc`` beside the package's own files, the JIT cache is under
``FLASHINFER_WORKSPACE_BASE``).  So a fix can be tried on an installed release: the patch is checked against the
installed package (refused, naming the file and the hunk, where it does not apply), then applied to a copy of the
package of its own (its files linked to the installed ones, every Python file and every file the patch touches
copied) and that copy goes first on this process's ``sys.path`` and on the ``PYTHONPATH`` the sweep's worker inherits,
with a workspace of its own, so the patched modules compile into a JIT cache of their own.  The copy loads no
prebuilt module (those were built from the unpatched sources).  The run records the patch in ``meta.json`` and names
the release ``BASE+NAME`` (``0.7.4+flashinfer-4992``), so that ``swabench matrix`` sets it beside the unpatched one.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from swabench.errors import UserError
from swabench.store import reading

LIBRARY, MODULE, DISTRIBUTION = "flashinfer", "flashinfer", "flashinfer-python"
ROOT_ENV = "SWABENCH_PATCHED"  # where the patched copies and their JIT caches live
DEFAULT_ROOT = Path("~/.cache/swabench/patched")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a patch's file stem: the release's local label
NOT_COPIED = ("data/aot", "__pycache__")  # prebuilt modules of the unpatched sources; bytecode
MARKER = "patch.json"  # written last into a finished copy: what it holds
# appended to the copy's jit/env.py: no module is taken prebuilt (an AOT folder of the package or an installed
# flashinfer-jit-cache), every one compiles from the copy's sources into its workspace
NO_PREBUILT = """
# swabench: a patched copy; every module compiles from these sources, none is loaded prebuilt
FLASHINFER_AOT_DIR = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "aot"
FLASHINFER_AOT_PROVIDERS = ()
FLASHINFER_AOT_DIRS = (FLASHINFER_AOT_DIR,)
"""


class PatchError(UserError):
    """A patch that cannot be used: the CLI exits 2 before any GPU work."""


@dataclass(frozen=True)
class Patch:
    path: Path
    name: str  # the file's stem: "flashinfer-4992"
    text: str
    sha256: str
    files: tuple[str, ...]  # the package-relative files it changes
    strip: int  # leading path components to drop (1 for a/ b/ paths)

    def record(self, base: str) -> dict:
        """What ``meta.json`` keeps of it (``patch``): the release it was applied to as ``base``."""
        return {"name": self.name, "file": str(self.path), "sha256": self.sha256, "files": list(self.files),
                "base": base, "library": LIBRARY}


def read(path) -> Patch:
    """The unified diff at ``path``; PatchError naming the file where it is unreadable, touches nothing, or names a
    path outside the package."""
    path = Path(path)
    text = reading.read_text(path, reading.LOG, lambda reason: PatchError(f"--patch {path}: {reason}"))
    if not NAME.fullmatch(path.stem) or path.suffix not in (".diff", ".patch"):
        raise PatchError(f"--patch {path}: the file name gives the release's label ({LIBRARY} 0.7.4+NAME): name it "
                         f"NAME.diff or NAME.patch, NAME of letters, digits, '.', '-' and '_'")
    old = [_path_of(line) for line in text.splitlines() if line.startswith("--- ")]
    new = [_path_of(line) for line in text.splitlines() if line.startswith("+++ ")]
    if not new or len(old) != len(new):
        raise PatchError(f"--patch {path}: not a unified diff (no '--- FILE' and '+++ FILE' lines that pair up); "
                         f"make one with `diff -u` or `git diff` against the package's files")
    named = [p for p in old + new if p != "/dev/null"]
    strip = 1 if all(p.startswith(("a/", "b/")) for p in named) else 0
    files = tuple(dict.fromkeys(_stripped(n if n != "/dev/null" else o, strip) for o, n in zip(old, new)))
    for f in files:
        if f.startswith("/") or ".." in Path(f).parts or not f:
            raise PatchError(f"--patch {path}: it names {f!r}; the paths must be relative to the {MODULE} package "
                             f"folder (data/include/flashinfer/..., jit/...)")
    return Patch(path, path.stem, text, hashlib.sha256(text.encode()).hexdigest(), files, strip)


def _path_of(line: str) -> str:
    return line[4:].split("\t")[0].strip()


def _stripped(name: str, strip: int) -> str:
    return "/".join(name.split("/")[strip:])


@dataclass(frozen=True)
class Installed:
    folder: Path  # the package folder: .../site-packages/flashinfer
    version: str


def installed() -> Installed:
    """The installed package's folder and release, found without importing it (an import would fix the unpatched
    one in this process); PatchError where it is not installed."""
    if MODULE in sys.modules:
        raise RuntimeError(f"{MODULE} was imported before --patch set up its patched copy")
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.origin:
        raise PatchError(f"--patch: {MODULE} is not installed here; a patch applies to an installed release's sources "
                         f"(install {DISTRIBUTION}, or run on the GPU node)")
    from swabench.run import environment

    folder = Path(spec.origin).resolve().parent
    return Installed(folder, environment.package_version(DISTRIBUTION) or _version_file(folder))


def _version_file(folder: Path) -> str:
    """The release a package without its dist-info names: 0.7's ``_build_meta.py`` (whose ``version.py`` reads it
    and holds only a fallback literal), else ``version.py``."""
    for name in ("_build_meta.py", "version.py"):
        found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", (folder / name).read_text()) \
            if (folder / name).is_file() else None
        if found and not found[1].startswith("0.0.0"):
            return found[1]
    return "unknown"


def check(patch: Patch, folder: Path, version: str) -> None:
    """PatchError naming each file and hunk that does not apply to the sources in ``folder`` (nothing is written)."""
    done = _apply(patch, folder, dry_run=True)
    if done.returncode != 0:
        raise PatchError(f"--patch {patch.path}: it does not apply to {LIBRARY} {version} ({folder}): "
                         f"{failures(done.stdout + done.stderr)}; nothing was built or run")


def _apply(patch: Patch, folder: Path, dry_run: bool) -> subprocess.CompletedProcess:
    """``patch`` (exact context, no reversed hunks, no backups) where it is installed, else ``git apply``."""
    if shutil.which("patch"):
        command = ["patch", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-",
                   f"-p{patch.strip}", "-d", str(folder), "-i", str(patch.path.resolve())]
        return subprocess.run(command + (["--dry-run"] if dry_run else []), capture_output=True, text=True)
    if not shutil.which("git"):
        raise PatchError(f"--patch {patch.path}: neither `patch` nor `git` is installed here to apply it")
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(folder.parent)}  # never the repository around the folder
    command = ["git", "-C", str(folder), "apply", f"-p{patch.strip}", str(patch.path.resolve())]
    return subprocess.run(command + (["--check"] if dry_run else []), capture_output=True, text=True, env=env)


def failures(output: str) -> str:
    """What ``patch`` or ``git apply`` said failed, a clause a file: 'data/x.cuh: hunk #2 (at line 628) FAILED'."""
    said, current = [], None
    for line in output.splitlines():
        if m := re.match(r"(?:checking|patching) file (.+)", line):
            current = m[1].strip()
        elif m := re.match(r"Hunk #(\d+) FAILED at (\d+)", line):
            said.append(f"{current}: hunk #{m[1]} (at line {m[2]}) does not match")
        elif m := re.match(r"can't find file to patch at input line (\d+)", line):
            said.append(f"the file at line {m[1]} of the patch is not in the package")
        elif "Reversed (or previously applied) patch detected" in line:
            said.append(f"{current}: already applied (its hunks match the patched side)")
        elif m := re.match(r"error: patch failed: (.+):(\d+)", line):
            said.append(f"{m[1]}: the hunk at line {m[2]} does not match")
        elif m := re.match(r"error: (.+): No such file or directory", line):
            said.append(f"{m[1]} is not in the package")
        elif m := re.match(r"(?:patch: \*\*\*\* |error: )(.*(?:malformed|corrupt|garbage).*)", line):
            said.append(m[1].strip())
    return "; ".join(dict.fromkeys(said)) or (output.strip().splitlines() or ["it failed"])[-1]


@dataclass(frozen=True)
class Copy:
    folder: Path  # ROOT/flashinfer-0.7.4+NAME-SHA12
    site: Path  # goes first on sys.path: holds the patched package
    workspace: Path  # FLASHINFER_WORKSPACE_BASE: the patched modules' JIT cache

    @property
    def package(self) -> Path:
        return self.site / MODULE


def root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT).expanduser()


def prepare(patch: Patch, source: Installed, where: Path | None = None) -> Copy:
    """The patched copy of ``source`` (made once, then reused with its JIT cache): a fresh one is built beside its
    final place and renamed into it whole, so a copy interrupted half-way is never taken for a finished one."""
    where = where or root()
    final = where / f"{MODULE}-{source.version}+{patch.name}-{patch.sha256[:12]}"
    copy = Copy(final, final / "site", final / "workspace")
    wanted = {"sha256": patch.sha256, "source": str(source.folder), "version": source.version}
    where.mkdir(parents=True, exist_ok=True)
    with open(where / f".{final.name}.lock", "w") as lock:  # two runs of one patch at once: one builds, one waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _prepared(patch, source, where, final, copy, wanted)


def _prepared(patch: Patch, source: Installed, where: Path, final: Path, copy: Copy, wanted: dict) -> Copy:
    marker = final / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return copy
    building = where / f".{final.name}.{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)  # a copy of another source, or left unfinished
    mirror(source.folder, building / "site" / MODULE, set(patch.files))
    done = _apply(patch, building / "site" / MODULE, dry_run=False)
    if done.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        raise PatchError(f"--patch {patch.path}: applying it to the copy failed: {failures(done.stdout + done.stderr)}")
    env_py = building / "site" / MODULE / "jit" / "env.py"
    if env_py.is_file():
        env_py.write_text(env_py.read_text() + NO_PREBUILT)
    (building / "workspace").mkdir()
    (building / MARKER).write_text(json.dumps(wanted))
    building.rename(final)
    return copy


def mirror(source: Path, target: Path, copied: set[str]) -> None:
    """``source``'s tree at ``target``: real folders; Python files and the files in ``copied`` copied (a module's
    ``__file__`` must resolve inside the copy, and a patched file must be a file of its own); every other file a link
    to the installed one (headers are found from the folder they are included from, so a folder is never linked)."""
    for folder, dirs, files in os.walk(source):
        rel = Path(folder).relative_to(source)
        dirs[:] = [d for d in dirs if (rel / d).as_posix() not in NOT_COPIED and d not in NOT_COPIED]
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            path = (rel / name).as_posix()
            if name.endswith(".py") or path in copied:
                shutil.copy2(Path(folder) / name, target / rel / name)
            else:
                os.symlink(Path(folder, name).resolve(), target / rel / name)


def activate(path, environ=None) -> dict:
    """Check ``path`` against the installed release, prepare its copy, and put the copy first for this process and
    the processes it starts; returns what ``meta.json`` records as ``patch``.  PatchError before anything is built
    or imported where the patch cannot be used."""
    environ = os.environ if environ is None else environ
    patch = read(path)
    source = installed()
    check(patch, source.folder, source.version)
    copy = prepare(patch, source)
    cubins = Path(environ.get("FLASHINFER_WORKSPACE_BASE") or Path.home()) / ".cache" / MODULE / "cubins"
    if "FLASHINFER_CUBIN_DIR" not in environ and cubins.is_dir():  # downloaded kernels are not built from sources
        environ["FLASHINFER_CUBIN_DIR"] = str(cubins)
    environ["FLASHINFER_WORKSPACE_BASE"] = str(copy.workspace)
    environ["PYTHONPATH"] = os.pathsep.join([str(copy.site)] + [p for p in [environ.get("PYTHONPATH")] if p])
    sys.path.insert(0, str(copy.site))
    importlib.invalidate_caches()
    spec = importlib.util.find_spec(MODULE)
    if spec is None or Path(spec.origin).resolve().parent != copy.package.resolve():
        raise PatchError(f"--patch {patch.path}: {MODULE} still imports from {spec and spec.origin}, not the patched "
                         f"copy {copy.package}")
    return {**patch.record(source.version), "package": str(copy.package)}


def label(meta: dict) -> dict:
    """``meta`` with its patched library named ``BASE+NAME``; PatchError where the release that ran is not the base
    the patch was applied to."""
    patch = meta.get("patch")
    if not patch:
        return meta
    libraries = dict(meta.get("libraries") or {})
    ran = libraries.get(patch["library"])
    if ran != patch["base"]:
        raise PatchError(f"the patched copy runs {patch['library']} {ran}, not {patch['base']}, the release it patches")
    libraries[patch["library"]] = f"{ran}+{patch['name']}"
    return {**meta, "libraries": libraries}
