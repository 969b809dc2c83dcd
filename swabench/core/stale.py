"""What a KV cache holds where no query may read: the ``cache_fill`` axis.

An engine reuses its cache: the rows past a request's last key in its last page, the pages no request holds (spare,
or freed when they fell out of the window) and a shared null page keep whatever was there, stale keys, NaN or Inf
after an overflow, ``torch.empty`` garbage.  A kernel may load such a row and mask its score; it must not let the
row reach the output (``0 * NaN`` is NaN).  With ``cache_fill = "random"`` (the default) every row is N(0, 1) data
as before and the layout is unchanged.  Any other fill gives the cache room no query may read and writes the fill
into every row no request holds one of its own keys in:

- paged: one spare page per request, placed right after that request's last page in the pool (the other pages move
  up, in their order), so a kernel that reads past the end of a request's last page lands on one;
- ragged: ``SPARE_ROWS`` rows after the last request's keys (an engine's ragged buffer is allocated to its
  capacity; rows between requests have no place there, since a request's keys run from its indptr to the next).

The keys a request holds keep the random data of the default layout, value for value: only the fill differs.
"""

from __future__ import annotations

SPARE_ROWS = 256  # ragged: rows past the last request's keys, more than any kernel's key tile here


def value(fill: str, dtype) -> float | None:
    """The number ``fill`` writes into a cache of torch ``dtype`` (None for random data): NaN, Inf, or half the
    dtype's largest finite value (a score or product of it overflows once a masked slot is multiplied)."""
    if fill == "random":
        return None
    if fill in ("nan", "inf"):
        return float(fill)
    if fill != "large":
        raise ValueError(f"cache_fill must be one of random, nan, inf, large; got {fill!r}")
    import torch

    return torch.finfo(dtype).max / 2


def refused(case) -> tuple[str, str] | None:
    """(field, why) where the fill cannot be written into the case's cache: an fp8 e4m3 cache has no Inf."""
    if case.cache_fill == "inf" and case.cache_dtype == "float8_e4m3":
        return "cache_fill", ("float8_e4m3 has no infinity (its overflow is NaN): give nan, large or random with "
                              "an fp8 cache")
    return None


def spare_pages(kv_indptr, kv_indices, num_pages: int):
    """The page table with one spare page after each request's last page: (indices, where each page of the
    table without spares went, the spare pages, the pool's page count).  Torch int64 tensors on the CPU."""
    import torch

    last = kv_indices[kv_indptr[1:] - 1]  # each request's own last page: never evicted, never shared
    before = torch.searchsorted(torch.sort(last).values, torch.arange(num_pages))  # last pages below each page
    moved = torch.arange(num_pages) + before
    return moved[kv_indices], moved, moved[last] + 1, num_pages + len(last)
