"""What narrows a query's keys inside a FlexAttention mask_mod, as a case sets it: the window, causality and the chunk
(``Span``), or a draft tree's nodes by their depth and ancestors (``TreeSpan``)."""

from __future__ import annotations

import torch


class Span:
    """What narrows a query's keys inside a mask_mod, as the case sets it: the window (a tensor, so a new W
    compiles nothing), causality and the chunk (a tensor too)."""

    def __init__(self, case, device):
        self.window = torch.tensor(case.window_left, dtype=torch.int32, device=device)
        self.chunk = torch.tensor(max(case.attention_chunk, 1), dtype=torch.int32, device=device)
        self.windowed, self.causal, self.chunked = case.window_left >= 0, case.causal, case.attention_chunk > 0

    def narrow(self, seen, key, p):
        """``seen`` narrowed to the keys at position ``key`` that a query at ``p`` sees."""
        seen = seen & (key <= p) if self.causal else seen
        seen = seen & (p - key <= self.window) if self.windowed else seen
        return seen & (key >= p - p % self.chunk) if self.chunked else seen


class TreeSpan(Span):
    """A verify block laid out as draft trees: request b's node q sits at position ``prefix + depth`` and sees the
    cached keys of its window by that position and, of the draft keys, its ancestors (each at its own depth)."""

    def __init__(self, w):
        super().__init__(w.case, w.device)
        dev = w.device
        self.prefix = torch.tensor(w.prefix_lens, dtype=torch.int32, device=dev)
        self.depth = torch.tensor([t.depths for t in w.trees], dtype=torch.int32, device=dev)
        self.ancestors = torch.stack([t.ancestors() for t in w.trees]).to(dev)
        self.last = w.trees[0].size - 1

    def narrow_node(self, seen, key, b, q):
        """``seen`` narrowed to the keys at column ``key`` that request b's node q sees."""
        prefix, node = self.prefix[b], q.clamp(max=self.last)
        slot = (key - prefix).clamp(min=0, max=self.last)
        draft = key >= prefix
        seen = seen & (key <= prefix + q) & torch.where(draft, self.ancestors[b, node, slot], True)
        position = torch.where(draft, prefix + self.depth[b, slot], key)
        return seen & (prefix + self.depth[b, node] - position <= self.window) if self.windowed else seen
