"""What FlashInfer's fa2 does with a window it is handed only at ``run()`` (``plan()`` built the kernel without one):
each query tile's keys start at its first query's window start, so a tile's later queries see keys before their
window, and where ``plan()`` split a request of several queries into more KV chunks than the window needs, the merge
reads its rows' partials out of step.  The prediction the paths that run W this way are held to, from the scheduler
arithmetic of ``fa2_split`` and the query tile the runners' plan picks."""

from __future__ import annotations

import torch

from swabench.core import semantics
from . import fa2_split
from .flashinfer_library import plans_uniform_q_len


def uniform_hint(qo_lens, hinted: bool = True) -> bool:
    """Whether a runner that passes ``uniform_q_len`` where it can (``hinted``) passes it for this batch: one query
    count, on a release that takes it."""
    return hinted and len(set(qo_lens)) == 1 and plans_uniform_q_len()


def run_window_tile(case, qo_lens, hinted: bool = True) -> int:
    """fa2's query tile for a batch planned as the runners plan it: the CUDA-graph mode the case asks for, and
    ``uniform_q_len`` where ``hinted`` runners pass it."""
    return fa2_split.query_tile(qo_lens, case.gqa_group, case.head_dim, case.wrapper_mode != "plain",
                                uniform_hint(qo_lens, hinted))


def window_at_run(case, qo_lens, kv_lens, backend: str, hinted: bool = True) \
        -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What each query sees, as key intervals, where ``plan()`` built the kernel without a window and ``run()``
    hands it W: on fa2 every key from its query tile's start (``fa2_split.run_window_first_keys``) up to itself,
    so a tile's first query is exact and each later one sees a key more; fa3 takes no window at run: every key."""
    tile = run_window_tile(case, qo_lens, hinted)
    seen = []
    for q, k in zip(qo_lens, kv_lens):
        first = fa2_split.run_window_first_keys(q, k, case.window_left, case.gqa_group, tile) \
            if backend == "fa2" and case.window_left >= 0 else [0] * q
        seen.append((torch.tensor(first), semantics.query_positions(q, k)))
    return seen


def merged_out_of_step(case, qo_lens, kv_lens, backend: str, page_size: int | None = None,
                       hinted: bool = True) -> list[torch.Tensor]:
    """The rows fa2 writes out of step where ``plan()`` had no window and ``run()`` hands it W: every row of a
    request of several queries that plan() split into more KV chunks than the window needs
    (``fa2_split.run_window_mixed``); none on fa3.  ``page_size``: the table's, where not the case's (1 for a
    ragged part)."""
    mixed = [False] * len(qo_lens)
    if backend == "fa2":
        mixed = fa2_split.run_window_mixed(qo_lens, kv_lens, case.window_left, page_size or case.page_size or 1,
                                           case.gqa_group, case.num_kv_heads, case.head_dim, fa2_split.device_sms(),
                                           case.wrapper_mode != "plain", uniform_hint(qo_lens, hinted))
    return [torch.full((q,), m) for q, m in zip(qo_lens, mixed)]
