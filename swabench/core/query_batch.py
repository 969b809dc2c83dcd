"""A workload's queries as the batched peers (FlexAttention, the embedded PyTorch paths) take them."""

from __future__ import annotations

import torch

from swabench.core.workloads import Workload


class QueryBatch:
    """A workload's queries as a ``[batch, heads, rows, dim]`` batch, rows = the longest request's queries,
    as batched peers take them: a view where every request has as many queries, else a padded copy made
    at each call (what a caller with ragged requests pays); ``write_back`` keeps the real rows only."""

    def __init__(self, w: Workload):
        c = w.case
        self.w, self.batch, self.rows = w, w.batch_size, max(w.qo_lens)
        self.uniform = len(set(w.qo_lens)) == 1
        prefix = torch.tensor(w.prefix_lens, device=w.device)
        self.index = w.query_request * self.rows + w.query_position - prefix[w.query_request]
        self.pad = None if self.uniform else \
            torch.zeros(self.batch * self.rows, c.num_qo_heads, c.head_dim, dtype=w.q.dtype, device=w.device)

    @property
    def label(self) -> str:
        return f"batch {self.batch} x {self.rows} queries{'' if self.uniform else ' (padded)'}"

    def queries(self) -> torch.Tensor:
        c, q = self.w.case, self.w.q
        if not self.uniform:
            self.pad[self.index] = q
            q = self.pad
        return q.view(self.batch, self.rows, c.num_qo_heads, c.head_dim).transpose(1, 2)

    def write_back(self, o: torch.Tensor, out: torch.Tensor) -> None:
        """``o`` [batch, heads, rows, dim] into ``out`` [total queries, heads, dim]."""
        c = self.w.case
        if self.uniform:
            out.view(self.batch, self.rows, c.num_qo_heads, c.head_dim).copy_(o.transpose(1, 2))
        else:
            out.copy_(o.transpose(1, 2).reshape(-1, c.num_qo_heads, c.head_dim)[self.index])
