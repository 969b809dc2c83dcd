"""FlashInfer as the registry knows it: the backends it takes and the shapes it is built for, its JIT cache (what a
warm-up built), and the sink wrapper's module names before 0.7.4 (flashinfer#1679)."""

from __future__ import annotations

import inspect
from functools import lru_cache

from .flashinfer_workspace import WORKSPACE_BYTES, build_failure
from .library import Library, not_importable
from .registry import register_library

BACKENDS = ("fa2", "fa3", "auto")
CUDNN = "cudnn"  # cuDNN's graphs: the decode wrapper's backend beyond fa2/fa3, flashinfer.cudnn's, the frontend's
XQA = "xqa"  # TRT-LLM's XQA decode kernel, called as a function (impls.xqa), asked for by name
FMHA_V2 = "fmha-v2"  # TRT-LLM's fmha v2 prefill kernels, called as a function (impls.fmha_v2), asked for by name
CUDA_CORE_BACKENDS = ("fa2", "auto", CUDNN)  # "auto": fa2's CUDA-core kernel on Hopper, cuDNN where its rule says
HEAD_DIMS = (64, 128, 256)
DTYPES = ("bfloat16", "float16")
# the GQA groups the CUDA-core decode kernel is instantiated for (include/flashinfer/utils.cuh, 0.7.2 and 0.7.4)
CUDA_CORE_DECODE_GROUPS = (1, 2, 3, 4, 6, 8, 16)


@lru_cache(maxsize=1)
def _import_error() -> str | None:
    return not_importable("flashinfer", "swabench[gpu]")


def jit_modules() -> dict[str, float]:
    """FlashInfer's compiled JIT modules on disk, name -> modification time ({} without flashinfer).
    Taken before and after a warm-up, the difference is what the warm-up built."""
    if _import_error():
        return {}
    from flashinfer.jit import env
    return {so.parent.name: so.stat().st_mtime for so in env.FLASHINFER_JIT_DIR.glob("*/*.so")}


def jit_cache_dir() -> str | None:
    if _import_error():
        return None
    from flashinfer.jit import env
    return str(env.FLASHINFER_JIT_DIR)


SINK_WRAPPERS = {False: "BatchAttentionWithAttentionSinkWrapper", True: "BatchDecodeWithAttentionSinkWrapper"}
SINK_HEAD_DIMS: dict[tuple, set[int]] = {}  # the sink wrapper's module name before 0.7.4 -> head_dims built here


def _sink_module(case, backend: str) -> tuple:
    """What FlashInfer before 0.7.4 named the sink wrapper's JIT module by: query dtype, window, backend."""
    return case.dtype, case.window_left >= 0, backend


def sink_head_dims_mixed(case, backend: str) -> bool:
    """Whether this process built the sink wrapper at two head_dims under one module name (flashinfer#1679)."""
    return len(SINK_HEAD_DIMS.get(_sink_module(case, backend), ())) > 1


def _shared_module(impl: str, case, backend: str):
    """The sink wrapper's points share a module name before 0.7.4 whatever their head_dim."""
    return ("sink", *_sink_module(case, backend)) if impl == "sink-window" else None


LIBRARY = register_library(Library("flashinfer", distributions=("flashinfer-python", "flashinfer"),
                                   module="flashinfer", backends=BACKENDS + (CUDNN, XQA, FMHA_V2),
                                   chooser="auto", opt_in=(CUDNN, XQA, FMHA_V2), served=(CUDNN, XQA, FMHA_V2),
                                   workspace_bytes=WORKSPACE_BYTES, jit_modules=jit_modules,
                                   jit_cache_dir=jit_cache_dir, shared_module=_shared_module,
                                   build_failure=build_failure))


def accepts(fn, name: str) -> bool:
    """Whether ``fn`` takes the keyword ``name`` (an argument some releases added)."""
    return name in inspect.signature(fn).parameters


@lru_cache(maxsize=1)
def plans_uniform_q_len() -> bool:
    """Whether the installed FlashInfer's prefill ``plan()`` takes ``uniform_q_len`` (which FlashInferRunner then
    passes for a batch of one query count, and which sizes fa2's query tile); where FlashInfer is not installed,
    as 0.7.4, the release of the published runs, does."""
    if _import_error():
        return True
    import flashinfer

    return accepts(flashinfer.BatchPrefillWithPagedKVCacheWrapper.plan, "uniform_q_len")


def has_api(name: str):
    """``available`` of a path that calls ``flashinfer.NAME`` (dotted: ``decode.xqa_batch_decode_with_kv_cache``):
    why the installed FlashInfer cannot run it (not importable, or a release without it), or None."""
    @lru_cache(maxsize=1)
    def check() -> str | None:
        error = _import_error()
        if error:
            return error
        import flashinfer

        found = flashinfer
        for part in name.split("."):
            found = getattr(found, part, None)
        return None if found is not None else f"flashinfer {LIBRARY.version()} has no {name}"
    return check
