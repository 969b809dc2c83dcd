"""What a number was measured on: machine, GPU, driver, libraries, code version, command line."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from swabench import __version__
from swabench.impls import registry

REPO = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd=None) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_state() -> dict:
    """The code's commit.  SWABENCH_GIT_COMMIT, where set, wins: a checkout copied to a GPU node can
    carry a stale .git (or none) beside newer files, and then only the sender knows the commit.  An
    installed wheel has no commit (its folder may sit inside some other repository)."""
    sent = os.environ.get("SWABENCH_GIT_COMMIT")
    if sent:
        return {"git_commit": sent, "git_dirty": None, "git_commit_from": "SWABENCH_GIT_COMMIT"}
    if not (REPO / "pyproject.toml").is_file():
        return {"git_commit": None, "git_dirty": None}
    commit = _run(["git", "rev-parse", "HEAD"], cwd=REPO)
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO)
    return {"git_commit": commit, "git_dirty": bool(dirty)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> dict:
    """GPU name, memory, SM count, and nvidia-smi's driver and clocks (as found: never changed)."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": None}
    props = torch.cuda.get_device_properties(0)
    info = {"gpu": props.name, "gpu_count": torch.cuda.device_count(),
            "gpu_memory_gib": round(props.total_memory / 2**30, 1), "gpu_sms": props.multi_processor_count,
            "compute_capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda}
    fields = "driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu"
    # nvidia-smi ignores CUDA_VISIBLE_DEVICES: ask it about the physical GPU this process was given
    physical = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    info["gpu_uuid"] = str(getattr(props, "uuid", "")) or None
    smi = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", physical])
    if smi:
        values = [v.strip() for v in smi.splitlines()[0].split(",")]
        info.update({f"nvidia_smi.{k}": v for k, v in zip(fields.split(","), values)})
    return info


def nsys_path() -> str | None:
    return shutil.which("nsys")


def collect(device="cpu") -> dict:
    """Everything needed to say where a number came from."""
    import torch

    nsys = nsys_path()
    return {
        "swabench": __version__,
        **git_state(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),  # a --gpus worker gets its share of the cores
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "libraries": registry.versions(),
        "nvtx": package_version("nvtx"),
        "nsys": nsys and (_run([nsys, "--version"]) or nsys),
        "device": str(device),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **gpu_info(),
        "command": collect_command(),
    }


def collect_command() -> str:
    """The command line, quoted so that it splits back into the same arguments (``--case "verify b8"``)."""
    return "swabench " + shlex.join(sys.argv[1:])


def describe(device, measure_peaks: bool = False) -> str:
    """What ``swabench env`` prints: ``collect``'s fields, the peaks if asked, the implementations
    usable here."""
    from swabench.measure import peaks
    from swabench.errors import UserError

    if measure_peaks and device.type != "cuda":
        raise UserError("--peaks: no CUDA device here; peaks are GPU measurements")
    info = collect(device)
    info.update({f"peak.{k}": v for k, v in (peaks.measure(device) if measure_peaks else {}).items()})
    info["implementations usable here"] = ", ".join(i.name for i in registry.all_implementations()
                                                    if not i.availability(device))
    return "\n".join(f"{k:28s} {v}" for k, v in info.items())
