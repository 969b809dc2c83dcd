"""Draft trees: the verify block of EAGLE-2/3 and MTP with ``topk > 1``, laid out as the engines flatten it.

A tree of ``n`` nodes is verified in one prefill call of ``n`` queries.  Node ``i`` sits in *slot* ``i`` (its row,
and the column its own key takes in the cache after the ``prefix`` cached keys) and at *depth* ``d`` (the root,
the last verified token, at depth 0).  Its position, and its RoPE position, is ``prefix + d``.  Every parent
comes before its children, so a node's ancestors hold smaller slots, and ``slot >= depth`` always; on a chain
the two are equal.

Two ways to give a tree, as the engines take them (docs/trees.md):

- ``eagle:TOPK:DEPTH`` with ``draft_tokens = N``: SGLang's EAGLE-2 dynamic tree.  From the root, each step
  expands the ``TOPK`` best frontier nodes by their ``TOPK`` most likely children, scoring a node by the product
  of the probabilities on its path; after ``DEPTH`` steps the ``N - 1`` best-scored candidates are kept and laid
  out in the order the candidates were made (by step, then by parent, then by child rank), behind the root.
  The child probabilities are drawn from the case's seed, one tree per request.
- A choice list, as vLLM's ``speculative_token_tree`` takes it: each node the path of child indices from the root,
  ``[(0,), (1,), (0, 0)]``; the root is implied.  vLLM lays the nodes out sorted by depth, then by path.

``chain`` is the same axis with one child per node (``topk = 1``): slot = depth, the control.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

CHAIN = "chain"
MAX_TOPK = MAX_STEPS = 16  # SGLang's launches use topk <= 10 and <= 10 steps; a larger tree is no draft an engine makes
FORMS = ("'chain', 'eagle:TOPK:DEPTH' (SGLang's dynamic tree, with draft_tokens nodes), or a choice list "
         "'[(0,), (1,), (0, 0)]' (vLLM's speculative_token_tree: each node the path of child indices from the root)")
MAX_NODES = 1024  # a verify block larger than this is no draft tree an engine builds


@dataclass(frozen=True)
class Tree:
    """One request's draft tree: ``parents[i]`` is node i's parent slot (-1 for the root, in slot 0)."""

    parents: tuple[int, ...]

    def __post_init__(self):
        if not self.parents or self.parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(self.parents)
                                                             if i):
            raise ValueError(f"a tree lists the root first and every parent before its children: {self.parents}")

    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        depth = [0] * self.size
        for i in range(1, self.size):
            depth[i] = depth[self.parents[i]] + 1
        return tuple(depth)

    @property
    def depth(self) -> int:
        return max(self.depths)

    @property
    def is_chain(self) -> bool:
        return all(d == i for i, d in enumerate(self.depths))

    def ancestors(self, device=None):
        """Bool ``[n, n]``: ``[i, s]`` is True when node s is node i or one of its ancestors."""
        import torch

        anc = torch.eye(self.size, dtype=torch.bool)
        for i in range(1, self.size):
            anc[i] |= anc[self.parents[i]]
        return anc.to(device)


def chain(n: int) -> Tree:
    return Tree((-1, *range(n - 1)))


# ---------------------------------------------------------------- SGLang's EAGLE-2 dynamic tree

def eagle_capacity(topk: int, depth: int) -> int:
    """Draft tokens (root included) the dynamic tree can hold: the root, TOPK candidates from the first step and
    TOPK * TOPK from each later one."""
    return 1 + topk + (depth - 1) * topk * topk


def eagle(topk: int, depth: int, n: int, rng: random.Random) -> Tree:
    """SGLang's dynamic tree (``EAGLEWorker.draft_forward``, ``select_top_k_tokens``, ``organize_draft_results``
    and ``build_tree_kernel_efficient``): candidates in the order the steps make them, their scores the products of
    drawn child probabilities, the ``n - 1`` best kept in candidate order behind the root."""
    scores: list[float] = []  # every candidate's score, in candidate order
    parent: list[int] = []  # each candidate's parent candidate (-1: the root)
    frontier = [(-1, 1.0)]  # (candidate, score) of the nodes the next step expands
    for step in range(min(depth, n - 1)):  # a kept node's ancestors are kept too: none sits deeper than n - 1
        made = []
        for node, score in frontier:
            for p in _child_probabilities(topk, rng):
                parent.append(node)
                scores.append(score * p)
                made.append((len(scores) - 1, score * p))
        frontier = sorted(made, key=lambda x: -x[1])[:topk]  # the step's TOPK best, best first (torch.topk)
    kept = sorted(sorted(range(len(scores)), key=lambda x: -scores[x])[:n - 1])
    slot = {-1: 0, **{c: i + 1 for i, c in enumerate(kept)}}
    return Tree((-1, *(slot[parent[c]] for c in kept)))


def _child_probabilities(topk: int, rng: random.Random) -> list[float]:
    """A node's TOPK most likely children: the largest TOPK shares of a flat Dirichlet over TOPK + 1 outcomes
    (the last one all the rest of the vocabulary), most likely first."""
    draws = [rng.expovariate(1.0) for _ in range(topk + 1)]
    total = sum(draws)
    return sorted((d / total for d in draws), reverse=True)[:topk]


# ---------------------------------------------------------------- vLLM's choice lists

def from_choices(choices) -> Tree:
    """A tree from its choice paths, laid out as vLLM's tree attention lays it out: root, then by depth and path."""
    ordered = sorted(choices, key=lambda c: (len(c), c))
    slot = {(): 0, **{c: i + 1 for i, c in enumerate(ordered)}}
    return Tree((-1, *(slot[c[:-1]] for c in ordered)))


_CHOICE = r"\(\s*\d{1,6}\s*(?:,\s*\d{1,6}\s*)*,?\s*\)"
_CHOICES = re.compile(rf"\[\s*{_CHOICE}\s*(?:,\s*{_CHOICE}\s*)*,?\s*\]", re.ASCII)
_EAGLE = re.compile(r"eagle:(\d{1,6}):(\d{1,6})", re.ASCII)


def parse_choices(text: str) -> tuple[tuple[int, ...], ...]:
    """'[(0,), (1,), (0, 0)]' -> ((0,), (1,), (0, 0)), parsed, never evaluated; ValueError saying what is wrong."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ValueError(f"must be {FORMS}; got {text[:80]!r}")
    if not _CHOICES.fullmatch(body):
        raise ValueError(f"a choice list is tuples of child indices, '[(0,), (1,), (0, 0)]'; got {text[:80]!r}")
    return check_choices([tuple(int(x) for x in m.group(0)[1:-1].split(",") if x.strip())
                          for m in re.finditer(_CHOICE, body, re.ASCII)])


def check_choices(choices) -> tuple[tuple[int, ...], ...]:
    """Each path once, every path's parent listed (the root is implied), at most MAX_NODES nodes."""
    paths = [tuple(c) if isinstance(c, (list, tuple)) else c for c in choices]
    if not paths:
        raise ValueError(f"a choice list names at least one node besides the root, as in {FORMS}")
    if len(paths) + 1 > MAX_NODES:
        raise ValueError(f"{len(paths) + 1} nodes: a draft tree holds at most {MAX_NODES}")
    seen = set()
    for c in paths:
        if not isinstance(c, tuple) or not c or any(not isinstance(x, int) or isinstance(x, bool) or x < 0
                                                    for x in c):
            raise ValueError(f"each choice is a non-empty path of child indices >= 0, as in {FORMS}; got {c!r}")
        if c in seen:
            raise ValueError(f"choice {c!r} is listed twice")
        seen.add(c)
    orphan = next((c for c in paths if len(c) > 1 and c[:-1] not in seen), None)
    if orphan:
        raise ValueError(f"choice {orphan!r} has no parent {orphan[:-1]!r} in the list")
    return tuple(sorted(paths, key=lambda c: (len(c), c)))  # the order vLLM lays them out: one tree, one id


# ---------------------------------------------------------------- the axis

def parse(value) -> str:
    """A ``tree`` axis value in its canonical form: 'chain', 'eagle:TOPK:DEPTH', or a choice list written
    '[(0,), (1,), (0, 0)]'.  ValueError naming the forms otherwise."""
    if isinstance(value, list):  # a TOML array of arrays
        return write_choices(check_choices(value))
    if not isinstance(value, str):
        raise ValueError(f"must be {FORMS}; got {value!r}")
    if value == CHAIN:
        return value
    if value.startswith("eagle"):
        found = _EAGLE.fullmatch(value)
        if found and 1 <= int(found.group(1)) <= MAX_TOPK and 1 <= int(found.group(2)) <= MAX_STEPS:
            return f"eagle:{int(found.group(1))}:{int(found.group(2))}"
        raise ValueError(f"'eagle:TOPK:DEPTH' takes TOPK from 1 to {MAX_TOPK} and DEPTH from 1 to {MAX_STEPS} "
                         f"(SGLang's speculative_eagle_topk and speculative_num_steps); got {value[:80]!r}")
    return write_choices(parse_choices(value))


def write_choices(choices) -> str:
    return "[" + ", ".join("(" + ", ".join(map(str, c)) + ("," if len(c) == 1 else "") + ")" for c in choices) + "]"


def node_count(spec: str, draft_tokens: int | None) -> int | None:
    """How many queries the tree verifies: a choice list's nodes and its root; else ``draft_tokens``."""
    return len(parse_choices(spec)) + 1 if spec.startswith("[") else draft_tokens


def check(spec: str, n: int) -> str | None:
    """Why ``spec`` cannot make a verify block of ``n`` queries, or None."""
    if spec.startswith("eagle"):
        _, topk, depth = spec.split(":")
        most = eagle_capacity(int(topk), int(depth))
        if not 2 <= n <= min(most, MAX_NODES):
            return (f"{spec} makes 2 to {min(most, MAX_NODES)} draft tokens (the root, {topk} candidates from the "
                    f"first step and {int(topk) ** 2} from each later one), not {n}")
    elif spec.startswith("[") and node_count(spec, n) != n:
        given = node_count(spec, n)
        return f"the choice list has {given - 1} nodes and the root: {given} draft tokens, not {n}"
    elif spec == CHAIN and not 1 <= n <= MAX_NODES:
        return f"a chain of {n} draft tokens: give 1 to {MAX_NODES}"
    return None


def is_chain(spec: str | None, n: int) -> bool:
    """Whether a tree of ``n`` nodes given this way is a chain (slot = depth for every node): 'chain', an EAGLE
    tree with one child a node, or a choice list that never branches."""
    if spec is None or spec == CHAIN or spec.startswith("eagle:1:"):
        return spec is not None
    return spec.startswith("[") and from_choices(parse_choices(spec)).is_chain


def label(spec: str) -> str:
    """How a case label shows its tree: 'chain', 'eagle:4:3', or '[63 choices, depth 5]'."""
    if not spec.startswith("["):
        return spec
    t = from_choices(parse_choices(spec))
    return f"[{t.size - 1} choices, depth {t.depth}]"


@lru_cache(maxsize=64)
def build(spec: str, n: int, batch: int, seed: int) -> tuple[Tree, ...]:
    """Each request's tree, deterministic in the seed (every request of an EAGLE case draws its own)."""
    if spec == CHAIN:
        return (chain(n),) * batch
    if spec.startswith("["):
        return (from_choices(parse_choices(spec)),) * batch
    _, topk, depth = spec.split(":")
    return tuple(eagle(int(topk), int(depth), n, random.Random(seed * 7919 + b)) for b in range(batch))


def of_case(case) -> tuple[Tree, ...] | None:
    """The case's trees, one per request (None where its verify block is not declared a tree)."""
    if case.tree is None:
        return None
    return build(case.tree, case.qo_len, case.batch_size, case.seed)
