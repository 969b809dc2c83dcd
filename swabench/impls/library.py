"""A library as the registry knows it: what installs it, the backends it takes, and the hooks the sweep reaches it
through (its JIT cache, its build failures, the library underneath it).  Registered with
``registry.register_library`` by the module that registers its implementations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable


@dataclass(frozen=True)
class Library:
    """A library as the rest of swabench knows it: its name, the distribution that installs it (whose
    version every run records), the backends it takes (``chooser`` lets the library pick one), and
    the hooks the sweep reaches it through: its compiled JIT modules on disk (name -> modification
    time; taken before and after a warm-up, the difference is what it built)."""

    name: str
    distributions: tuple[str, ...] = ()  # the first one installed says the library is here
    module: str | None = None  # the import name whose __version__ is the release that runs
    backends: tuple[str, ...] = ()
    chooser: str | None = None  # the backend value that lets the library choose ("auto")
    # backends a scenario may ask for by name but that no scenario's default takes (a package the node may lack,
    # minutes of JIT build)
    opt_in: tuple[str, ...] = ()
    # of those, the ones a replay or price runs unasked: kernels an engine routes a served step to
    served: tuple[str, ...] = ()
    workspace_bytes: int | None = None  # the smallest scratch workspace a runner of it gets, where it takes one
    jit_modules: Callable[[], dict[str, float]] = dict
    jit_cache_dir: Callable[[], str | None] = lambda: None
    # (implementation, case, backend) -> a key shared by points whose builds must run one after another, never at
    # once (JIT modules that may carry one name: one build would replace the file another is loading; a compiler
    # that is not thread-safe), or None
    shared_module: Callable[..., Hashable | None] = lambda impl, case, backend: None
    # an error -> the library's message where it says a JIT module could not be built, else None: the points that
    # meet it skip, wherever the library builds (at plan, or on a kernel's first call)
    build_failure: Callable[[BaseException], str | None] = lambda e: None
    # the library underneath the package, where its release is its own (the cuDNN the frontend loaded): recorded
    # beside the package's release, "1.32.0 (9.19.0)"
    underneath: Callable[[], str | None] = lambda: None

    def version(self) -> str | None:
        """The release that runs: the module's own ``__version__`` where it has one (a folder that holds
        two releases' package records, one unpacked over the other, names the wrong one), else the
        installed distribution's."""
        import importlib
        from importlib.metadata import PackageNotFoundError, version

        for distribution in self.distributions:
            try:
                installed = version(distribution)
            except PackageNotFoundError:
                continue
            try:
                running = getattr(importlib.import_module(self.module), "__version__", None) if self.module else None
            except Exception:  # installed but not importable here (no CUDA): the record is all there is
                running = None
            below = self.underneath()
            return (str(running) if running else installed) + (f" ({below})" if below else "")
        return None

    def __post_init__(self):
        assert set(self.served) <= set(self.opt_in), f"{self.name}: a served backend is one of the opt-in ones"

    @property
    def chosen_backends(self) -> tuple[str, ...]:
        """The backends a user picks among (every one but the chooser and the opt-in ones)."""
        return tuple(b for b in self.backends if b != self.chooser and b not in self.opt_in)

    @property
    def serving_backends(self) -> tuple[str, ...]:
        """The backends a replay or price runs when none is named: the chosen ones and the served opt-in ones."""
        return self.chosen_backends + tuple(b for b in self.opt_in if b in self.served)


def not_importable(module: str, install: str) -> str | None:
    """Why ``module`` does not import here (not installed, or a broken CUDA setup inside its import), saying what
    to ``install``; None where it imports."""
    import importlib

    try:
        importlib.import_module(module)
    except Exception as e:
        return f"{module} is not importable ({type(e).__name__}: {e}); install {install}"
    return None
