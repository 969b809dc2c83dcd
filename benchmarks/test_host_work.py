"""Host-side work a serving step pays before the kernel, with pytest-benchmark: building and packing
the custom mask (the naive path), trimming page tables (the kv_start_idx path), and the indptr and
last-page arrays every paged path needs, from small to large batches and contexts.

Run through `swabench bench-host`, which saves the JSON into a run folder and plots it."""

import os

import pytest
import torch

from swabench.core import semantics, workloads
from swabench.core.cases import Case

QUICK = os.environ.get("SWABENCH_BENCH_QUICK") == "1"
BATCHES = [1, 8] if QUICK else [1, 8, 32, 64]
CONTEXTS = [1024] if QUICK else [2048, 8192, 32768]
WINDOW, DRAFT, PAGE = 1023, 16, 16


def lengths(batch, context):
    return [DRAFT] * batch, [context + DRAFT] * batch


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("batch", BATCHES)
def test_custom_mask_build_and_pack(benchmark, batch, context):
    qo, kv = lengths(batch, context)
    vis = semantics.Visibility(WINDOW)

    def build_and_pack():
        starts = torch.cumsum(torch.tensor([0] + [q * k for q, k in zip(qo, kv)]), 0)
        flat = semantics.custom_mask(qo, kv, vis)
        return [semantics.pack_bits_little(flat[starts[i]:starts[i + 1]]) for i in range(batch)]

    packed = benchmark(build_and_pack)
    assert sum(p.numel() for p in packed) == semantics.packed_mask_bytes(qo, kv)


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("batch", BATCHES)
def test_trimmed_page_table(benchmark, batch, context):
    # made directly: no gate runs here, so the tiny head_dim needs no room for probe inputs
    c = Case(mode="verify", storage="paged", batch_size=batch, prefix_len=context, seq_len=None, qo_len=DRAFT,
             accept=None, window_left=WINDOW, page_size=PAGE, page_layout="scattered", num_qo_heads=1,
             num_kv_heads=1, head_dim=8, dtype="float32", seed=0)
    w = workloads.build(c)
    starts = [semantics.trim_start(k, q, WINDOW, PAGE) for q, k in zip(w.qo_lens, w.kv_lens)]
    indptr, indices, kv = benchmark(workloads.trim_page_table, w.kv_indptr_host, w.kv_indices_host, w.kv_lens,
                                    starts, PAGE)
    assert kv == [k - s for k, s in zip(w.kv_lens, starts)] and len(indices) == int(indptr[-1])


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("batch", BATCHES)
def test_indptr_and_last_page_arrays(benchmark, batch, context):
    _, kv = lengths(batch, context)

    def arrays():
        pages = [(n + PAGE - 1) // PAGE for n in kv]
        indptr = torch.cumsum(torch.tensor([0] + pages, dtype=torch.int32), 0, dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * PAGE for n, p in zip(kv, pages)], dtype=torch.int32)
        return indptr, last

    indptr, last = benchmark(arrays)
    assert int(indptr[-1]) == sum((n + PAGE - 1) // PAGE for n in kv) and int(last.max()) <= PAGE
