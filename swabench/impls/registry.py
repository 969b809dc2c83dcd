"""The implementation registry: every implementation (an ``implementation.Implementation``) and library, in the
order plots and tables show them, and the roles they play in the results (the baseline speedups are measured
against, the reference path other paths are divided by), all declared where the implementation is registered.

Adding a library is one module in ``MODULES`` that calls ``register`` (and ``register_library`` with its
``library.Library``).  The modules load on first use, so importing the sweep or a reader loads no library.
"""

from __future__ import annotations

import importlib

from swabench.core.cases import MODES, STORAGES
from .implementation import Implementation
from .library import Library

KINDS = ("correct", "known-bug", "planted")
# each registers its implementations on import
MODULES = ("flashinfer_impls", "recipes", "chunked", "embedded", "flex", "flex_flat", "sink_decode", "tree_verify",
           "ranges", "xqa", "fmha_v2", "batch_attention", "mixed", "cudnn", "fa4", "fa3")


class Unsupported(Exception):
    """Raised by make()/plan() for a combination the library cannot run; recorded as a skip."""


class ResourceError(Exception):
    """Raised by make()/plan()/run() when the library runs out of something (workspace, memory) or
    cannot build a module: recorded as a skip with the library's own message, never as a failure."""


_REGISTRY: dict[str, Implementation] = {}
_ORIGIN: dict[str, str] = {}  # implementation -> the module that registered it
# Modules loaded only when a scenario names one of their implementations; no listing, replay or price sees them
OPT_IN = ("planted_crashes",)
_OPT_IN: dict[str, Implementation] = {}
_LIBRARIES: dict[str, Library] = {}
_LOADED = False


def _load() -> None:
    """Import every implementation module, then order the registry by MODULES (and by registration
    within a module), and the libraries by their first implementation, so the order of plots, tables and
    backends does not hang on what imported what first."""
    global _LOADED
    if not _LOADED:
        for module in MODULES:  # a module that fails to import fails every use, not just the first
            importlib.import_module(f"{__package__}.{module}")
        rank = {f"{__package__}.{m}": i for i, m in enumerate(MODULES)}
        ordered = sorted(_REGISTRY.values(), key=lambda impl: rank.get(_ORIGIN[impl.name], len(rank)))
        _REGISTRY.clear()
        _REGISTRY.update((impl.name, impl) for impl in ordered)
        first = {}  # each library where its first implementation stands
        for i, impl in enumerate(ordered):
            first.setdefault(impl.library, i)
        libraries = sorted(_LIBRARIES.values(), key=lambda library: first.get(library.name, len(ordered)))
        _LIBRARIES.clear()
        _LIBRARIES.update((library.name, library) for library in libraries)
        _LOADED = True


def register(impl: Implementation, module: str) -> Implementation:
    """Add ``impl``, registered by ``module`` (its ``__name__``)."""
    assert impl.kind in KINDS and impl.name not in _REGISTRY and impl.name not in _OPT_IN, impl.name
    assert not (impl.baseline and impl.expected_to_fail), f"{impl.name}: a baseline must be correct"
    assert set(impl.modes) <= set(MODES) and set(impl.storages) <= set(STORAGES), \
        f"{impl.name}: its modes and storages must be among {MODES} and {STORAGES}: a scenario makes no other"
    (_OPT_IN if module.rpartition(".")[2] in OPT_IN else _REGISTRY)[impl.name] = impl
    _ORIGIN[impl.name] = module
    return impl


def register_library(library: Library) -> Library:
    _LIBRARIES[library.name] = library
    return library


def get(name: str) -> Implementation:
    _load()
    if name not in _REGISTRY:
        _load_opt_in()
        return _OPT_IN[name]
    return _REGISTRY[name]


def known(name: str) -> bool:
    """Whether ``name`` is an implementation, an opt-in one (``OPT_IN``) included."""
    _load()
    if name not in _REGISTRY:
        _load_opt_in()
    return name in _REGISTRY or name in _OPT_IN


def opt_in_names() -> list[str]:
    _load()
    _load_opt_in()
    return list(_OPT_IN)


def _load_opt_in() -> None:
    for module in OPT_IN:
        importlib.import_module(f"{__package__}.{module}")


def names() -> list[str]:
    """Every implementation, in registration order (the order of plots and tables)."""
    _load()
    return list(_REGISTRY)


def all_implementations() -> list[Implementation]:
    _load()
    return list(_REGISTRY.values())


def libraries() -> list[Library]:
    _load()
    return list(_LIBRARIES.values())


def build_failure(e: BaseException, library_name: str) -> str | None:
    """The library's message where ``e``, raised by one of its paths, is a module it could not build, else None."""
    lib = library(library_name)
    return lib.build_failure(e) if lib else None


def library(name: str) -> Library | None:
    _load()
    return _LIBRARIES.get(name)


def backends() -> tuple[str, ...]:
    """Every backend value some library takes (the ``backend`` axis)."""
    return tuple(dict.fromkeys(b for lib in libraries() for b in lib.backends))


def versions() -> dict[str, str | None]:
    """Each library's installed version (None where it is not installed): what a run records."""
    return {lib.name: lib.version() for lib in libraries()}


def baseline_for(library: str, storage: str) -> str | None:
    """The baseline a path of ``library`` on ``storage`` is sped up against: its own library's, else
    the first registered one for that storage (a peer without a naive path of its own is measured
    against FlashInfer's)."""
    candidates = [i for i in all_implementations() if i.baseline and storage in i.storages]
    own = [i for i in candidates if i.library == library]
    pick = own or candidates
    return pick[0].name if pick else None


def reference_path(storage: str) -> tuple[str, str] | None:
    """(implementation, backend) every other path on ``storage`` is compared with, or None."""
    for impl in all_implementations():
        if impl.reference and storage in impl.storages:
            return impl.name, impl.reference
    return None


def describe_reference() -> str:
    """The reference paths in words, e.g. 'paged-window / ragged-window on fa2'."""
    paths = {reference_path(s) for s in ("paged", "ragged")} - {None}
    backends = {b for _, b in paths}
    return " / ".join(sorted(i for i, _ in paths)) + (f" on {backends.pop()}" if len(backends) == 1 else "")


def order(name: str) -> int:
    """Position in registration order (unknown names last): plots and tables sort by it."""
    known = names()
    return known.index(name) if name in known else len(known)


def listing(device) -> str:
    """One line per implementation: kind, library, storages, what it does, its role, and why it
    cannot run on ``device`` if it cannot."""
    lines, every = [], all_implementations()
    width = max(len(impl.name) for impl in every)
    for impl in every:
        here = impl.availability(device)
        role = "baseline" if impl.baseline else f"reference on {impl.reference}" if impl.reference else ""
        lines.append(f"  {impl.name:{width}s} {impl.kind:9s} {impl.library:10s} {'/'.join(impl.storages):12s} "
                     f"{impl.summary}" + (f" [{role}]" if role else "") + (f"  [not here: {here}]" if here else ""))
    return "\n".join(lines)
