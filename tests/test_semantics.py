import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swabench.core import semantics
from swabench.core.semantics import Visibility

shapes = st.tuples(st.integers(1, 40), st.integers(0, 60), st.integers(-1, 50)).map(
    lambda t: (t[0], t[0] + t[1], t[2]))  # (qo_len, kv_len >= qo_len, window_left)


def brute_mask(qo_len, kv_len, w):
    """The definition, element by element: query p sees key j iff j <= p and (no window or j >= p - w)."""
    return torch.tensor([[j <= p and (w < 0 or j >= p - w) for j in range(kv_len)]
                         for p in range(kv_len - qo_len, kv_len)])


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(shapes)
def test_pair_count_matches_brute_force(shape):
    qo, kv, w = shape
    assert semantics.useful_pairs(qo, kv, w) == int(brute_mask(qo, kv, w).sum())


@settings(max_examples=100, deadline=None)
@given(shapes)
def test_mask_matches_definition(shape):
    qo, kv, w = shape
    assert torch.equal(Visibility(w).mask(qo, kv), brute_mask(qo, kv, w))


@settings(max_examples=100, deadline=None)
@given(shapes, st.integers(1, 64), st.integers(1, 8))
def test_flops_and_bytes_match_brute_force(shape, head_dim, heads):
    qo, kv, w = shape
    m = brute_mask(qo, kv, w)
    assert semantics.attention_flops(int(m.sum()), head_dim, heads) == 4 * head_dim * heads * int(m.sum())
    keys_read = int(m.any(dim=0).sum())  # K/V rows some query can see
    expect = 2 * (2 * qo * heads + 2 * keys_read * 1) * head_dim
    assert sum(semantics.minimum_traffic([qo], [kv], w, heads, 1, head_dim, 2)) == expect


def brute_rows_read(qo_len, kv_len, w, causal, chunk, page_size):
    """K/V rows a perfect kernel reads, by enumeration: every row of every page that holds a key some
    query sees (a page table starts on a page boundary; ragged storage is one-row pages)."""
    pages = set()
    for i in range(qo_len):
        p = kv_len - qo_len + i
        for j in range(kv_len):
            if (j <= p or not causal) and (w < 0 or j >= p - w) and (chunk == 0 or j >= p - p % chunk):
                pages.add(j // page_size)
    return sum(1 for r in range(kv_len) if r // page_size in pages)


@settings(max_examples=300, deadline=None)
@given(shapes, st.sampled_from(["paged", "ragged"]), st.sampled_from([1, 2, 3, 16, 64]), st.booleans(),
       st.sampled_from([0, 0, 1, 4, 7, 16]), st.integers(1, 4), st.integers(1, 3), st.sampled_from([1, 2]))
def test_minimum_traffic_matches_brute_force(shape, storage, page, causal, chunk, qo_heads, kv_heads, kv_width):
    """Every storage, page size, window, chunk and causal setting: Q and the rows of every page some query
    reads in, O out.  A chunk replaces the window and is causal, as the axes allow."""
    qo, kv, w = shape
    if chunk:
        w, causal = semantics.NO_WINDOW, True
    page_size = page if storage == "paged" else 1
    head_dim, width = 8, 2
    read, written = semantics.minimum_traffic([qo], [kv], w, qo_heads, kv_heads, head_dim, width, kv_width, chunk,
                                              page_size)
    rows = brute_rows_read(qo, kv, w, causal, chunk, page_size)
    assert written == qo * qo_heads * head_dim * width
    assert read == written + 2 * rows * kv_heads * head_dim * kv_width
    assert semantics.minimum_traffic([qo, qo], [kv, kv], w, qo_heads, kv_heads, head_dim, width, kv_width, chunk,
                                     page_size) == (2 * read, 2 * written)


def test_a_page_table_starts_on_a_page_boundary():
    """The floor counts the rows before the first visible key in its page: decode at 100 keys with a
    window of 9 sees keys 90..99; one-token pages read 10 rows, 16-row pages the 20 from row 80."""
    assert semantics.window_keys(1, 100, 9) == 10
    assert semantics.window_keys(1, 100, 9, page_size=16) == 20


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(shapes, st.integers(1, 32))
def test_trim_keeps_every_visible_key_on_a_page_boundary(shape, page_size):
    qo, kv, w = shape
    start = semantics.trim_start(kv, qo, w, page_size)
    m = brute_mask(qo, kv, w)
    assert start % page_size == 0
    assert not m[:, :start].any(), "trimmed away a key some query must see"
    if page_size == 1 and w >= 0 and kv - qo - w > 0:
        assert m[0, start], "page_size 1 trims exactly to the first query's window"


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(shapes)
def test_request_granular_trim_is_wrong_exactly_where_the_issue_says(shape):
    """paged-trim-causal: kv_start = max(0, prefix - W), causal, no window. It must differ from the
    exact semantics exactly when qo_len > 1 and prefix + qo_len - 1 > W."""
    qo, kv, w = shape
    if w < 0:
        return
    prefix = kv - qo
    bug = Visibility(semantics.NO_WINDOW, first_key=semantics.buggy_trim_start(prefix, w))
    brute_bug = torch.zeros(qo, kv, dtype=torch.bool)
    for i in range(qo):
        brute_bug[i, semantics.buggy_trim_start(prefix, w):prefix + i + 1] = True
    assert torch.equal(bug.mask(qo, kv), brute_bug)
    expected = qo > 1 and prefix + qo - 1 > w
    assert semantics.differs(bug, Visibility(w), qo, kv) == expected
    assert (not torch.equal(brute_bug, brute_mask(qo, kv, w))) == expected


def test_window_conventions_round_trip():
    assert semantics.window_left_from(sliding_window=4096) == 4095
    assert semantics.window_left_from(window_left=127) == 127
    assert semantics.window_left_from(sliding_window=-1) == -1
    assert semantics.sliding_window_of(4095) == 4096
    assert semantics.sliding_window_of(-1) == -1


def test_plan_without_window_is_wrong_once_kv_len_exceeds_the_window():
    causal = Visibility(semantics.NO_WINDOW)
    for w in (0, 3, 16):
        assert not semantics.differs(causal, Visibility(w), 1, w + 1)
        assert semantics.differs(causal, Visibility(w), 1, w + 2)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=100))
def test_bit_packing_is_little_endian(bits):
    packed = semantics.pack_bits_little(torch.tensor(bits))
    expect = [sum(1 << i for i, b in enumerate(bits[k:k + 8]) if b) for k in range(0, len(bits), 8)]
    assert packed.tolist() == expect


@settings(max_examples=150, deadline=None)
@given(shapes, st.booleans(), st.integers(0, 20))
def test_non_causal_and_chunked_visibility_match_their_definitions(shape, causal, chunk):
    """Non-causal (FlashInfer's plan(causal=False, window_left=W)): query p sees every key j of its request
    with j >= p - W.  Chunked (chunk C > 0, causal): query p sees keys floor(p / C) * C .. p."""
    qo, kv, w = shape
    want = torch.tensor([[(j <= p or not causal) and (w < 0 or j >= p - w) and (chunk == 0 or j >= p // chunk * chunk)
                          for j in range(kv)] for p in range(kv - qo, kv)])
    assert torch.equal(Visibility(w, causal=causal, chunk=chunk).mask(qo, kv), want)
    if not chunk:
        assert semantics.useful_pairs(qo, kv, w, causal) == int(want.sum())


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 64), st.integers(1, 3), st.integers(1, 40))
def test_a_chunk_read_as_a_window_sees_the_previous_chunk(chunk, chunks_before, into):
    """The natural mistake: a chunk of C keys as a window of C - 1 (window_left = C - 1).  Any query past
    a chunk's first key but short of its last sees keys of the chunk before."""
    into = into % chunk
    p = chunks_before * chunk + into
    exact = Visibility(-1, chunk=chunk).mask(1, p + 1)
    as_window = Visibility(chunk - 1).mask(1, p + 1)
    assert bool((as_window & ~exact).any()) == (into < chunk - 1)
