"""Token trees: the shapes tree speculation needs, with no model and no acceptance math in them.

A drafter that can branch (several likely continuations: the draft model's second choice, a suffix
table that saw two endings) proposes a tree instead of a chain: ``Draft.tokens [N]`` with
``Draft.parents [N]`` (``-1``: the node follows the last committed token; otherwise the index of an
earlier node). The target scores every node in one forward — each node at the position of its depth,
attending to the committed context and to its own ancestors only (SpecInfer/Medusa tree attention) —
so every node's logits are those of decoding its path alone (bit-identical where the layers are row
by row: the int8/int4 CPU paths; tests/test_tree.py). :func:`specdec.verify.verify_tree` then walks
the tree and the caches keep the accepted path (``KVCache.keep``).

:class:`TreeLayout` describes a tree region of a KV cache: the slots from ``base`` on, each with the
slot (within the region) of its parent. The target's region is one forward (the last committed
token, then the draft's nodes); a draft model growing a tree level by level adds a level per forward
to its own region.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


def check_parents(parents: Sequence[int], count: int | None = None) -> None:
    """Parents must come before their children (``-1 <= parents[i] < i``): then any prefix of the
    node list is a tree, and one pass in index order sees every parent before its children."""
    if count is not None and len(parents) != count:
        raise ValueError(f"a tree of {count} tokens needs {count} parents, got {len(parents)}")
    for index, parent in enumerate(parents):
        if not -1 <= parent < index:
            raise ValueError(f"tree node {index} has parent {parent}: parents must be -1 or an earlier node")


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of every node: 1 for a child of the root (``-1``), its parent's + 1 below."""
    result: list[int] = []
    for parent in parents:
        result.append(1 if parent < 0 else result[parent] + 1)
    return result


def children(parents: Sequence[int]) -> dict[int, list[int]]:
    """Node → its children in index order (``-1`` → the root's); the verifier tries them in this order."""
    result: dict[int, list[int]] = {}
    for index, parent in enumerate(parents):
        result.setdefault(parent, []).append(index)
    return result


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """Nodes from the root's child down to ``node`` (inclusive)."""
    path: list[int] = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def chain_parents(length: int) -> list[int]:
    """The parents of a chain: each token follows the one before it."""
    return list(range(-1, length - 1))


def subtree(parents: Sequence[int], nodes: Sequence[int]) -> list[int]:
    """Parents of the tree made of ``nodes`` (ascending, closed under parents), renumbered 0..len-1."""
    new_index = {old: new for new, old in enumerate(nodes)}
    return [-1 if parents[old] < 0 else new_index[parents[old]] for old in nodes]


def ranked_nodes(parents: Sequence[int], estimates: Sequence[float]) -> list[int]:
    """Nodes from the most to the least likely to be accepted, each after its parent, so that every
    prefix of the ranking is a tree: highest ``estimates`` first (an estimate is the probability
    that the node's whole path is accepted, so it should not exceed its parent's; a node ranked
    above its parent anyway waits for it). EAGLE-2's reranking: the verification budget goes to the
    likeliest paths wherever they are in the tree."""
    order = sorted(range(len(parents)), key=lambda n: (-estimates[n], n))
    ranked: list[int] = []
    placed: set[int] = set()
    waiting: dict[int, list[int]] = {}
    for node in order:
        if parents[node] >= 0 and parents[node] not in placed:
            waiting.setdefault(parents[node], []).append(node)
            continue
        stack = [node]
        while stack:
            current = stack.pop()
            ranked.append(current)
            placed.add(current)
            stack.extend(reversed(waiting.pop(current, [])))
    return ranked


def first_chain(parents: Sequence[int]) -> list[int]:
    """The path through every node's first child: the chain a tree drafter ranks best."""
    kids = children(parents)
    path, node = [], -1
    while kids.get(node):
        node = kids[node][0]
        path.append(node)
    return path


@dataclass(frozen=True)
class TreeLayout:
    """A tree region of a KV cache: slots ``base .. base + len(parents)``; slot ``base + i`` holds
    a token whose parent is region slot ``parents[i]`` (``-1``: the token follows slot ``base - 1``,
    the last one before the region). The forward that ends the region appends its last ``new`` slots.

    The token in region slot i sits at position ``base + depth(i) - 1`` and attends to every slot
    before ``base`` and to its ancestors in the region (and itself)."""

    base: int
    parents: list[int]

    def __post_init__(self) -> None:
        check_parents(self.parents)

    def positions(self, new: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """RoPE positions ``[new]`` of the region's last ``new`` slots."""
        level = depths(self.parents)[len(self.parents) - new :]
        return torch.tensor([self.base + d - 1 for d in level], dtype=torch.long, device=device)

    def mask(self, new: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[new, base + len(parents)]`` bool (True = may attend) for the region's last ``new`` slots."""
        size = len(self.parents)
        region = torch.zeros(size, size, dtype=torch.bool)
        for index, parent in enumerate(self.parents):
            if parent >= 0:
                region[index] = region[parent]
            region[index, index] = True
        mask = torch.ones(new, self.base + size, dtype=torch.bool)
        mask[:, self.base :] = region[size - new :]
        return mask.to(device)
