"""Probe inputs: data built so that one leaked or one missing key moves an output row by O(1).

Random inputs are nearly blind at large windows (one extra key among 4096 moves a row by well
under 1%).  Here every query row is tuned to one *edge* of its own window, at distance ``c`` from
itself: the key just outside the window (``c = W + 1``), the key on the window's edge (``c = W``),
the first future key (``c = -1``) or the diagonal (``c = 0``).  Its logits follow a deterministic
profile that is highest at distance ``c`` and at least ``2 * SCALE`` nats lower at every other
distance, so

- a row tuned to an excluded key (W + 1, -1) is ruled by that key the moment it leaks in;
- a row tuned to an included key (W, 0) loses the key that rules it the moment it is dropped.

The profile is a sum of cosines at frequencies pi / 2^i (i = 0..n-1), realised exactly as q.k with
q = f(p - c), k = f(j): it peaks at distance c with n, and any other distance x has some i where
pi * (x - c) / 2^i is an odd multiple of pi, costing at least 2.  The slot of sin(pi x), zero at
every integer x, carries a constant key against ``-n * SCALE`` in the query instead: it shifts every
row so its peak logit is 0.  A soft-cap is then nearly linear where the answer is decided
(cap * tanh(-16 / cap) is still about -16 nats at a cap of 50), and a sink logit of 0 takes half of
every row, so a dropped sink moves it by O(1).  No randomness, so no row is ever left untested by
chance; heads and passes rotate the edges so every row meets each of them.

A row is tuned to one key *column* (q = f(target), k = f(column)), so an edge may sit anywhere a row's
definition puts it.  On a draft tree the window edges count from the node's position (``prefix + depth``) and
land on the cached key, or the ancestor, at that position: a path that measures the window from the node's
slot instead loses the window-edge key of every node whose slot is past its depth.  The near edges count
from the node's own column, and a fifth edge tunes a row to the last draft key before it that is not its
ancestor (a sibling or a cousin), which a path without the tree mask lets in.  In bidirectional blocks three
edges count from the row's block: its last key and its first (both seen, whatever the window) and the key just
after it (not seen): a causal path loses the first, and a path with the wrong blocks gains or loses the others.
"""

from __future__ import annotations

import math

import torch

SCALE = 8.0  # nats per unit of profile; the smallest gap (2 units) is 16 nats, e^-16 ~ 1e-7
SHIFT = 1  # the feature sin(pi x): zero at every integer, so free to carry the shift


def edges(window_left: int, causal: bool = True, chunk: int = 0, tree: bool = False,
          block: int = 0) -> list[tuple[int, str, str]]:
    """(distance a row is tuned to, name, what the distance counts from) for every edge the window has: 'position'
    (the row's position: ``prefix + depth`` on a tree), 'slot' (the row's own key), 'chunk' (the row's chunk
    start), 'cousin' (the last draft key before the row that is not its ancestor), 'block end' or 'block start'
    (its bidirectional block's last or first key).  Without ``causal`` the first future key is visible: a row
    tuned to it catches a path that drops future keys.  Under chunked attention the edges are the chunk's first
    key and the key before it."""
    near = [(-1, "future key" if causal else "future key (visible)", "slot"), (0, "diagonal", "slot")]
    if tree:
        near.append((0, "non-ancestor", "cousin"))
    if block:
        near += [(0, "block end", "block end"), (-1, "after block", "block end"), (0, "block start", "block start")]
    if chunk > 0:
        return [(1, "before chunk", "chunk"), (0, "chunk start", "chunk")] + near
    if window_left < 0:
        return near
    return [(window_left + 1, "outside window", "position"), (window_left, "window edge", "position")] + near


def frequencies_needed(max_kv_len: int, window_left: int) -> int:
    """Enough octaves that the profile does not repeat over every distance a row can meet."""
    span = 2 * max_kv_len + max(window_left, 0) + 4
    return max(1, math.ceil(math.log2(span)))


def required_head_dim(max_kv_len: int, window_left: int) -> int:
    return 2 * frequencies_needed(max_kv_len, window_left)


def largest_window(max_kv_len: int, head_dim: int) -> int:
    """The largest window_left whose edges the probes still tell apart at this head_dim."""
    return 2 ** (head_dim // 2) - 2 * max_kv_len - 4


def features(x: torch.Tensor, n_freq: int, head_dim: int) -> torch.Tensor:
    """[cos(pi x / 2^i), sin(pi x / 2^i)] for i < n_freq, zero-padded to head_dim (float64).

    The angle is reduced with integer arithmetic first, so large positions lose no precision."""
    x = x.to(torch.int64)
    out = torch.zeros(*x.shape, head_dim, dtype=torch.float64, device=x.device)
    for i in range(n_freq):
        angle = torch.remainder(x, 2 ** (i + 1)).double() * (math.pi / 2 ** i)
        out[..., 2 * i], out[..., 2 * i + 1] = torch.cos(angle), torch.sin(angle)
    return out


def profile(x: torch.Tensor, n_freq: int) -> torch.Tensor:
    """The logit profile in units (before SCALE) at offset x from the tuned distance."""
    return sum(torch.cos(torch.remainder(x, 2 ** (i + 1)).double() * (math.pi / 2 ** i)) for i in range(n_freq))


def passes(num_qo_heads: int, window_left: int, chunk: int = 0, tree: bool = False, block: int = 0) -> int:
    """Probe passes needed so that every row meets every edge in some head."""
    return math.ceil(len(edges(window_left, chunk=chunk, tree=tree, block=block)) / num_qo_heads)


def _targets(w, found) -> torch.Tensor:
    """The key column each row is tuned to for each edge: ``[rows, edges]``."""
    c, column = w.case, w.query_position  # each row's own key
    branch = _Nodes(w) if w.trees is not None else None
    if c.block:  # each row's block: the first key of its run of B queries, counted from the request's first
        prefix = torch.tensor(w.prefix_lens, device=column.device)[w.query_request]
        first = prefix + (column - prefix) // c.block * c.block
        last = torch.minimum(first + c.block - 1, torch.tensor(w.kv_lens, device=column.device)[w.query_request] - 1)
    out = []
    for distance, _, base in found:
        if base == "position":
            target = column - distance if branch is None else branch.column_at(branch.position - distance)
        elif base == "chunk":
            target = column - column % c.attention_chunk - distance
        elif base == "cousin":
            target = branch.cousin
        elif base == "block end":
            target = last - distance
        elif base == "block start":
            target = first - distance
        else:
            target = column - distance
        out.append(target)
    return torch.stack(out, dim=1)


class _Nodes:
    """Each row of a tree case as the node it is: its position (``prefix + depth``), the slot of its ancestor at
    each depth, and the column of the last draft key before it that is not its ancestor (its own column + 1
    where there is none)."""

    def __init__(self, w):
        prefix, depth, at_depth, cousin = [], [], [], []
        most = max(t.depth for t in w.trees)
        for tree, p in zip(w.trees, w.prefix_lens):
            anc = tree.ancestors()
            for i, d in enumerate(tree.depths):
                line = [s for s in range(i + 1) if anc[i, s]]  # root first, the node itself last
                prefix.append(p)
                depth.append(d)
                at_depth.append(line + [i] * (most + 1 - len(line)))
                others = [s for s in range(i) if not anc[i, s]]
                cousin.append(p + (others[-1] if others else i + 1))
        dev = w.device
        self.prefix = torch.tensor(prefix, device=dev)
        self.position = self.prefix + torch.tensor(depth, device=dev)
        self.at_depth = torch.tensor(at_depth, device=dev)
        self.cousin = torch.tensor(cousin, device=dev)

    def column_at(self, position: torch.Tensor) -> torch.Tensor:
        """The column of the key at ``position`` in each row's branch: a cached key, or an ancestor."""
        depth = (position - self.prefix).clamp(min=0, max=self.at_depth.shape[1] - 1)
        ancestor = self.prefix + self.at_depth.gather(1, depth[:, None])[:, 0]
        return torch.where(position < self.prefix, position, ancestor)


def fill(w, pass_index: int, seed: int) -> torch.Tensor:
    """Write probe data into the workload's buffers in place; return the edge index of every
    (query row, head), for naming the row that failed."""
    c = w.case
    found = edges(c.window_left, c.causal, c.attention_chunk, w.trees is not None, c.block)
    n_freq = frequencies_needed(max(w.kv_lens), c.window_left)
    need = required_head_dim(max(w.kv_lens), c.window_left)
    if need > c.head_dim:
        raise ValueError(f"probe inputs need head_dim >= {need} for {max(w.kv_lens)} keys (got {c.head_dim})")
    dev = w.device
    pos = w.query_position
    heads = torch.arange(c.num_qo_heads, device=dev)
    edge = (heads[None, :] + pass_index * c.num_qo_heads + pos[:, None]) % len(found)
    q = features(_targets(w, found).gather(1, edge), n_freq, c.head_dim)
    q[..., SHIFT] = -n_freq  # with the keys' constant 1 below: the peak logit is 0
    w.q.copy_((q * (SCALE / w.sm_scale)).to(w.dtype))
    k = features(torch.arange(max(w.kv_lens), device=dev), n_freq, c.head_dim)[:, None, :]
    k[..., SHIFT] = 1.0
    if w.sinks is not None:
        w.write_sinks(0.0)  # level with each row's peak: half of the row's weight
    g = torch.Generator(device=dev).manual_seed(seed + 1000 + pass_index)
    v = torch.randn(sum(w.kv_lens), c.num_kv_heads, c.head_dim, generator=g, device=dev)
    w.write_kv(k, v)
    w.data = ("probe", pass_index, seed)
    return edge


def edge_name(window_left: int, index: int, causal: bool = True, chunk: int = 0, tree: bool = False,
              block: int = 0) -> str:
    return edges(window_left, causal, chunk, tree, block)[index][1]
