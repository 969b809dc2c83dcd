"""The GPU's clock and why it is held back, read through NVML (``nvidia-ml-py``) around each timed point,
so that a time measured while the card slowed itself for power or heat is flagged instead of trusted, and its
maximum clocks and memory bus width, which give its peak, the ceiling.  Only read, never set: the card's clocks
are left as found."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# NVML's clocks-event reasons (nvmlClocksEventReason*), by bit
REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
           0x100: "display_clocks"}
THROTTLES = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # power or heat: the card ran slower than it would have


@dataclass(frozen=True)
class Reading:
    sm_mhz: int
    reasons: int  # NVML's bit mask
    power_violation_ns: int  # NVML's running totals of time held back by power and by heat
    thermal_violation_ns: int


def names(mask: int) -> str:
    """'sw_power_cap+hw_slowdown', 'none' for no reason."""
    return "+".join(name for bit, name in REASONS.items() if mask & bit) or "none"


@functools.lru_cache(maxsize=None)
def _handle(uuid: str):
    """NVML's handle of the GPU with this UUID (torch's index and NVML's differ under CUDA_VISIBLE_DEVICES);
    None where NVML or the binding is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # no binding, no driver, a UUID NVML does not know: no clock columns, nothing else lost
        return None


def read(device: torch.device) -> Reading | None:
    """The clock and the reasons now; None off a GPU or where NVML cannot be read."""
    if device.type != "cuda":
        return None
    import torch

    handle = _handle(str(torch.cuda.get_device_properties(device).uuid))
    if handle is None:
        return None
    import pynvml

    try:
        violation = [pynvml.nvmlDeviceGetViolationStatus(handle, policy).violationTime
                     for policy in (pynvml.NVML_PERF_POLICY_POWER, pynvml.NVML_PERF_POLICY_THERMAL)]
        return Reading(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                       pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle), *violation)
    except Exception:  # an NVML error, or an older binding without these calls: no clock columns, no failed point
        return None


def columns(before: Reading | None, after: Reading | None) -> dict:
    """A timed point's clock columns: the SM clock and the reasons before and after it was timed, and
    ``throttled`` when either reading names power or heat, or NVML's violation time grew in between."""
    if before is None or after is None:
        return {}
    grew = after.power_violation_ns > before.power_violation_ns or \
        after.thermal_violation_ns > before.thermal_violation_ns
    return {"sm_clock_mhz_before": before.sm_mhz, "sm_clock_mhz_after": after.sm_mhz,
            "clock_reasons_before": names(before.reasons), "clock_reasons_after": names(after.reasons),
            "throttled": bool((before.reasons | after.reasons) & THROTTLES) or grew}


def maxima(device: torch.device) -> tuple[dict, str]:
    """The GPU's maximum memory and SM clocks (MHz) and its memory bus width (bits) as NVML reports them, which
    give its peak at maximum clocks (``measure.ceiling``), and where they came from; ({}, why) where NVML cannot
    be read."""
    import torch

    handle = _handle(str(torch.cuda.get_device_properties(device).uuid))
    if handle is None:
        return {}, "NVML could not be read (no nvidia-ml-py binding, driver or GPU it knows)"
    import pynvml

    try:
        return ({"memory_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                 "memory_bus_bits": pynvml.nvmlDeviceGetMemoryBusWidth(handle),
                 "sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)},
                "from NVML's maximum memory and SM clocks and memory bus width")
    except Exception as e:  # an NVML error, or an older binding without these calls
        return {}, f"NVML could not be read ({type(e).__name__}: {e})"
