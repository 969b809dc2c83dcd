"""A Triton kernel that stores one value 2^40 elements past its buffer: CUDA's "illegal memory access", for
``planted_crashes`` (a module of its own, so that importing it fails cleanly where Triton is missing)."""

import triton
import triton.language as tl


@triton.jit
def _store_far_away(pointer):
    tl.store(pointer + (1 << 40), 1.0)


def store_far_away(target) -> None:
    _store_far_away[(1,)](target)
