"""The float workspace FlashInfer's planner takes, sized to the workload, and the library's resource errors:
a wrapper planned in a workspace that holds its workload (doubled on overflow up to a cap), one buffer per
device shared by every wrapper as serving engines share theirs, and out of memory or a module that would
not build turned into a skip with the library's message."""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from swabench.core import workloads
from .registry import ResourceError

MIB = 1 << 20
WORKSPACE_BYTES = 256 * MIB  # the smallest float workspace a runner gets (FlashInfer's examples use 128 MiB)
WORKSPACE_CAP = 4096 * MIB  # the largest tried (less where the device has less free)
# FlashInfer's messages: AlignedAllocator (include/flashinfer/allocator.h); run_ninja
# (flashinfer/jit/cpp_ext.py) and MissingJITCacheError (flashinfer/jit/core.py).
OVERFLOW = "Increase the workspace buffer size"
BUILD_FAILED = ("Ninja build failed", "JIT compilation is disabled")


_shared: dict[str, torch.Tensor] = {}


def _allocate(device: torch.device, nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    """The first ``nbytes`` of the device's float workspace, shared by every wrapper as serving
    engines share theirs.  The shared buffer is the largest asked for so far; a wrapper keeps its
    own reference, so growing it never pulls memory from under an older wrapper, and a wrapper sees
    exactly the size it asked for (what ``workspace_mib`` records does not depend on run order)."""
    key = str(device)
    if key not in _shared or _shared[key].numel() < nbytes:
        _shared.pop(key, None)  # free the smaller one first where no wrapper holds it
        _shared[key] = _allocate(device, nbytes)
    return _shared[key][:nbytes]


def _workspace_cap(device: torch.device) -> int:
    if torch.device(device).type != "cuda":
        return WORKSPACE_CAP
    return min(WORKSPACE_CAP, workloads.free_bytes(torch.device(device)) // MIB * MIB)


def _estimate(wrapper, args, kwargs) -> int:
    """FlashInfer's own count of the float workspace plan() takes (``workspace_size``: 0.7.2 has it
    on the paged wrapper for fa2), else 0.  The count only saves retries: where it declines the
    arguments, plan() has its say."""
    count = getattr(wrapper, "workspace_size", None)
    try:
        return int(count(*args, **kwargs)[0]) if count else 0
    except (NotImplementedError, TypeError, ValueError):
        return 0


def brief(e: BaseException) -> str:
    """A library error in a line: its first line, plus the first compiler error of a build log."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()] or [type(e).__name__]
    first_error = next((line for line in lines[1:] if "error:" in line), None)
    return " ... ".join(line[:300] for line in (lines[0], first_error) if line)


def build_failure(e: BaseException) -> str | None:
    """The library's message where ``e`` says FlashInfer could not build a JIT module, else None: ninja failed, JIT
    is off, or a source or template the module is generated from is missing from the package's ``data/`` (a release
    unpacked without its csrc).  XQA and fmha v2 build on their first call, so this fails in run(), not plan().  A
    module that was built but will not load (a stale cache, a missing symbol) is not this: it fails its points."""
    if isinstance(e, RuntimeError) and any(marker in str(e) for marker in BUILD_FAILED):
        return brief(e)
    if isinstance(e, FileNotFoundError) and f"{os.sep}flashinfer{os.sep}data{os.sep}" in str(e.filename or ""):
        return brief(e)
    return None


@contextmanager
def resource_errors():
    """Out of memory, or a JIT module that would not build: ResourceError (a skip, with the
    library's message), not a failure of the implementation.  Anything else passes through."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as e:
        raise ResourceError(brief(e)) from e
    except Exception as e:
        failure = build_failure(e)
        if failure is None:
            raise
        raise ResourceError(failure) from e


def plan_in_workspace(new_wrapper, wrapper, size: int, device, args, kwargs, grows=("tmp_",)):
    """Plan with a float workspace that holds this workload: (the planned wrapper, its workspace bytes).

    In CUDA-graph mode fa2's planner reserves split-kv partial outputs for the worst case: in 0.7.2,
    num_qo_heads x head_dim_vo floats for each of padded_tiles x cta_tile_q / group_size rows (260 MiB
    at GPT-OSS extend shapes).  Start from FlashInfer's own count where it has one and double on
    overflow up to the cap; a CUDA-graph wrapper takes its buffers at construction, so each size gets
    a new wrapper (``new_wrapper(workspace)``).  Only an overflow of a buffer ``grows`` names is retried: an
    overflow of the int workspace (fixed by FlashInfer) is not."""
    cap = _workspace_cap(device)
    estimate = -(-_estimate(wrapper, args, kwargs) // MIB) * MIB
    want = min(cap, max(WORKSPACE_BYTES, estimate))
    while True:
        if want != size:
            wrapper, size = new_wrapper(workspace(device, want)), want
        try:
            wrapper.plan(*args, **kwargs)
            return wrapper, size
        except RuntimeError as e:
            if OVERFLOW not in str(e):
                raise
            if size >= cap or not any(name in str(e) for name in grows):
                raise ResourceError(f"{brief(e)} at {size // MIB} MiB") from e
            want = min(cap, 2 * size)


def plan_sized(runner, args, kwargs, grows=("tmp_",)) -> None:
    """``runner.wrapper.plan()``: the first in a workspace grown to what it needs (``plan_in_workspace``, from
    ``runner._workspace_bytes``; ``runner.workspace_mib`` records it), every later one, timed, in that workspace.
    FlashInfer's resource errors are skips."""
    with resource_errors():
        if runner.workspace_mib is None:
            runner.wrapper, size = plan_in_workspace(runner._new_wrapper, runner.wrapper, runner._workspace_bytes,
                                                     runner.w.device, args, kwargs, grows)
            runner._workspace_bytes, runner.workspace_mib = size, size // MIB
        else:
            runner.wrapper.plan(*args, **kwargs)
