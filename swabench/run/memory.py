"""Whether a case, and each point's own call, fit in this device's free memory (the estimates of
``core.footprint`` against it), and an allocator's refusal told apart from a failure: memory this machine
lacks is a skip with the library's message, never a wrong answer."""

from __future__ import annotations

import torch

from swabench.core import footprint, workloads
from swabench.core.cases import Case, Point
from swabench.impls import registry


def too_big(case: Case, device: torch.device) -> str | None:
    """Why the case's workload and gate cannot be held on this device, or None."""
    fp = footprint.footprint(case, device.type)
    return _over(fp, device, fp.device_bytes + (fp.host_bytes if device.type == "cpu" else 0), "")


def call_too_big(point: Point, device: torch.device) -> str | None:
    """Why the point's own call (its dense masks, or what PyTorch materializes on the CPU) does not fit beside
    its case's workload and gate, or None."""
    impl = registry.get(point.impl)
    fp = footprint.footprint(point.case, device.type)
    masks = fp.mask_bytes if impl.baseline else 0
    call = footprint.call_bytes(point.case, impl.library, device.type)
    if not masks + call:
        return None
    extra = (f", dense masks {footprint.human_bytes(masks)}" if masks else "") + \
        (f", {impl.library}'s call {footprint.human_bytes(call)}" if call else "")
    return _over(fp, device, fp.device_bytes + (fp.host_bytes if device.type == "cpu" else 0) + masks + call, extra)


def _over(fp: footprint.Footprint, device: torch.device, need: int, extra: str) -> str | None:
    free = workloads.free_bytes(device)
    if need <= free:
        return None
    return (f"resource: the case needs about {footprint.human_bytes(need)} on {device.type} ({fp.describe()}{extra}); "
            f"{footprint.human_bytes(free)} free")


def out_of_memory(e: BaseException) -> str | None:
    """The first line of an allocator's refusal (CUDA's; the CPU allocator's RuntimeError, or Python's
    MemoryError: a resource this machine lacks, like CUDA's), or None for any other error."""
    text = str(e).strip()
    cpu = isinstance(e, RuntimeError) and "DefaultCPUAllocator" in text
    if not (cpu or isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError))):
        return None
    return text.splitlines()[0] if text else type(e).__name__
