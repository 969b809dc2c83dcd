"""The implementation registry: what each implementation is, where it runs, where it must fail.

An implementation is a recipe: ``make(workload, backend)`` returns a Runner whose ``plan()`` does
the host-side work a serving step pays (timed apart) and whose ``run()`` launches the attention into
a pre-allocated ``out`` (gated, then timed).  Adding a library is one module that calls ``register``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Protocol

import torch

from .. import semantics

KINDS = ("correct", "known-bug", "planted")


class Unsupported(Exception):
    """Raised by make()/plan() for a combination the library cannot run; recorded as a skip."""


class Runner(Protocol):
    out: torch.Tensor
    resolved_backend: str

    def plan(self) -> None: ...

    def run(self) -> None: ...


def exact(window_left: int, prefix_len: int, page_size: int) -> semantics.Visibility:
    return semantics.Visibility(window_left)


@dataclass(frozen=True)
class Implementation:
    name: str
    library: str
    storages: tuple[str, ...]
    summary: str
    make: Callable[..., Runner]
    kind: str = "correct"
    backends: tuple[str, ...] = ()  # FlashInfer backends it runs on; () = the library has none
    needs_cuda: bool = False
    # What the implementation actually computes, as (window_left, prefix_len, page_size) -> Visibility.
    # Known bugs and planted mistakes differ from the exact semantics; that is how the gate knows
    # where each must fail.
    visibility: Callable[[int, int, int], semantics.Visibility] = exact
    unsupported: Callable[..., str | None] = lambda case, backend: None
    available: Callable[[], str | None] = lambda: None  # None = usable here, else why not
    # For an implementation whose kernels are compiled inside the process that first runs them
    # (Inductor): case -> which compiled kernel the case runs.  Points share a compile only when
    # they run in one worker, so sharding gathers them (shards._units).  None: nothing compiled.
    compile_class: Callable[..., Hashable] | None = None

    @property
    def expected_to_fail(self) -> bool:
        return self.kind != "correct"

    def must_fail(self, case, qo_lens, kv_lens) -> bool:
        """Whether some query of this workload sees a different key set than the exact semantics."""
        if not self.expected_to_fail:
            return False
        truth = semantics.Visibility(case.window_left)
        return any(semantics.differs(self.visibility(case.window_left, k - q, case.page_size or 1), truth, q, k)
                   for q, k in zip(qo_lens, kv_lens))

    def availability(self, device: torch.device) -> str | None:
        """Why this implementation cannot run on this device at all, or None."""
        if self.needs_cuda and device.type != "cuda":
            return f"{self.library} needs CUDA (device is {device.type})"
        return self.available()

    def skip_reason(self, case, backend: str, device: torch.device) -> str | None:
        """Why this point cannot run here (recorded as a skip row), or None."""
        return self.availability(device) or self.unsupported(case, backend)


_REGISTRY: dict[str, Implementation] = {}


def register(impl: Implementation) -> Implementation:
    assert impl.kind in KINDS and impl.name not in _REGISTRY, impl.name
    _REGISTRY[impl.name] = impl
    return impl


def get(name: str) -> Implementation:
    return _REGISTRY[name]


def names() -> list[str]:
    return list(_REGISTRY)


def all_implementations() -> list[Implementation]:
    return list(_REGISTRY.values())


from . import embedded, flashinfer_impls, flex  # noqa: E402,F401  (each registers its implementations)
