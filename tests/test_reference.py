import math

import pytest
import torch

from swabench.core import reference, workloads
from swabench.inputs import axes


def naive(w):
    """Element-by-element softmax attention over the definition of the window (float64)."""
    c = w.case
    out = torch.zeros(w.q.shape, dtype=torch.float64)
    group = c.num_qo_heads // c.num_kv_heads
    row = 0
    for b, (qo, kv) in enumerate(zip(w.qo_lens, w.kv_lens)):
        k, v, q = w.keys(b).double(), w.values(b).double(), w.queries(b).double()
        for i in range(qo):
            p = kv - qo + i
            for h in range(c.num_qo_heads):
                js = [j for j in range(kv) if j <= p and (c.window_left < 0 or j >= p - c.window_left)]
                logits = torch.stack([q[i, h] @ k[j, h // group] for j in js]) / math.sqrt(c.head_dim)
                out[row + i, h] = torch.softmax(logits, 0) @ v[js, h // group]
        row += qo
    return out


@pytest.mark.parametrize("window_left,storage", [(3, "paged"), (-1, "paged"), (0, "ragged"), (10, "ragged")])
def test_reference_matches_the_definition(window_left, storage):
    c = axes.make_case(dict(mode="draft_extend", draft_tokens=5, prefix_len=9, window_left=window_left,
                                 num_qo_heads=4, num_kv_heads=2, head_dim=16, dtype="float32",
                                 batch_size=3, page_size=4, storage=storage))
    w = workloads.build(c)
    torch.testing.assert_close(reference.attention(w), naive(w), rtol=1e-10, atol=1e-10)


def test_reference_chunking_changes_nothing(monkeypatch):
    c = axes.make_case(dict(mode="extend", extend_len=40, prefix_len=30, window_left=7,
                                 num_qo_heads=2, num_kv_heads=1, head_dim=16, dtype="bfloat16"))
    w = workloads.build(c)
    whole = reference.attention(w)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 50)
    torch.testing.assert_close(reference.attention(w), whole, rtol=0, atol=1e-12)
