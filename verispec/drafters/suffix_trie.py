"""Suffix tries over token sequences: how often each short run of tokens occurred and which
token followed it, the counts suffix decoding drafts from (drafters/suffix.py).

A SuffixTrie holds sequences (a request's prompt and output, growing as tokens arrive, or the
outputs of finished requests) and counts every substring of at most max_depth tokens: the node
of path P counts the occurrences of P, and its children count the tokens that followed them.
Memory stays proportional to the tokens held, not to max_depth times as many: a node that only
one occurrence reaches is *lazy*, it keeps a pointer (seq, pos) to that occurrence's next token
instead of a chain of single-child nodes, and grows one explicit child when a second occurrence
comes through. Removing a sequence decrements its counts and frees the nodes that reach 0.

A cursor names a place in the trie: (node, None, 0, depth) at an explicit node, or
(None, seq, pos, depth) inside a lazy chain, whose next token is seq[pos].
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence


class _TrieNode:
    """count occurrences of this node's path; children by next token (None: none yet); or,
    while lazy (seq is not None), the single occurrence's continuation seq[pos:]."""

    __slots__ = ("children", "count", "pos", "seq")

    def __init__(self, seq: list[int] | None, pos: int) -> None:
        self.count = 1
        self.children: dict[int, _TrieNode] | None = None
        self.seq = seq
        self.pos = pos


Cursor = tuple[_TrieNode | None, list[int] | None, int, int]
"""(explicit node or None, lazy sequence or None, position of the next token in it, depth)."""


class SuffixTrie:
    """Counts of every substring of at most max_depth tokens over a set of keyed sequences.

    Example, max_depth 3, one sequence [1, 2, 1, 3]: the path [1] counts 2, and its children
    count 2 once and 3 once; continuations([1]) = {2: 1, 3: 1}, continuations([2, 1]) = {3: 1},
    continuations([3]) = {} (the sequence ends there). Extending it with [1, 2] makes [1, 2]
    count 2 (continuations([1, 2]) = {1: 1}: the second [1, 2] has no next token yet).
    """

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _TrieNode(None, 0)
        self.root.children = {}
        self.num_nodes = 0
        """Nodes below the root, explicit and lazy (memory is proportional to it)."""
        self._tokens: dict[Hashable, list[int]] = {}
        self._open: dict[Hashable, list[list]] = {}
        """Per sequence that may grow: [start, node, depth] of each suffix shorter than
        max_depth, node the deepest explicit or lazy node its path reached so far."""

    def __len__(self) -> int:
        return len(self._tokens)

    def sequence(self, key: Hashable) -> list[int]:
        """The tokens of sequence `key` (the trie's own list: read it, never change it)."""
        return self._tokens[key]

    def extend(self, key: Hashable, tokens: Iterable[int]) -> None:
        """Append tokens to sequence `key` (a new one if absent), counting every new substring:
        O(max_depth) per token."""
        seq = self._tokens.setdefault(key, [])
        suffixes = self._open.setdefault(key, [])
        for token in tokens:
            n = len(seq)
            seq.append(token)
            # Oldest (longest) suffix first: a lazy node that a later suffix's step expands
            # then belongs to a suffix already done, whose new token the expansion counts.
            for entry in suffixes:
                start, node, depth = entry
                while depth < n - start and node.seq is None:  # catch up through expansions
                    node = node.children[seq[start + depth]]  # type: ignore[index]
                    depth += 1
                if depth == n - start and node.seq is None:  # else a lazy chain holds it
                    node, depth = self._bump(node, token, depth + 1, seq, n + 1), depth + 1
                entry[1], entry[2] = node, depth
            suffixes.append([n, self._bump(self.root, token, 1, seq, n + 1), 1])
            if n + 1 - suffixes[0][0] >= self.max_depth:  # that suffix is complete
                suffixes.pop(0)

    def _bump(
        self, parent: _TrieNode, token: int, depth: int, seq: list[int], after: int
    ) -> _TrieNode:
        """Count one more occurrence of parent's path + token (a node at `depth`), explicit
        parent; seq[after:] is what follows this occurrence. Returns the child."""
        if parent.children is None:
            parent.children = {}
        child = parent.children.get(token)
        if child is None:  # a new path: lazy, unless at the depth limit (no continuation)
            lazy = seq if depth < self.max_depth else None
            child = parent.children[token] = _TrieNode(lazy, after)
            self.num_nodes += 1
            return child
        if child.seq is not None:  # a second occurrence: make the first one's next step explicit
            first, pos = child.seq, child.pos
            child.seq = None
            if pos < len(first):
                lazy = first if depth + 1 < self.max_depth else None
                child.children = {first[pos]: _TrieNode(lazy, pos + 1)}
                self.num_nodes += 1
        child.count += 1
        return child

    def close(self, key: Hashable) -> None:
        """Sequence `key` will not grow: drop its bookkeeping for appends."""
        self._open.pop(key, None)

    def remove(self, key: Hashable) -> None:
        """Forget sequence `key`: every count it added goes, and nodes left at 0 are freed."""
        seq = self._tokens.pop(key)
        self._open.pop(key, None)
        for start in range(len(seq)):
            node = self.root
            for token in seq[start : start + self.max_depth]:
                child = node.children[token]  # type: ignore[index]
                child.count -= 1
                if child.count == 0:  # a lazy node always ends here: it counted only this
                    del node.children[token]  # type: ignore[union-attr]
                    self.num_nodes -= _subtree_size(child)
                    break
                node = child

    def find(self, pattern: Sequence[int]) -> Cursor | None:
        """Where pattern's path ends (None: it never occurred, or is longer than max_depth)."""
        if len(pattern) > self.max_depth:
            return None
        node = self.root
        for i, token in enumerate(pattern):
            if node.seq is not None:  # lazy: the rest must be its occurrence's continuation
                rest, seq, pos = list(pattern[i:]), node.seq, node.pos
                if seq[pos : pos + len(rest)] != rest:
                    return None
                return (None, seq, pos + len(rest), len(pattern))
            child = node.children.get(token) if node.children else None
            if child is None:
                return None
            node = child
        return _cursor(node, len(pattern))

    def next_tokens(self, cursor: Cursor) -> list[tuple[int, int, Cursor]]:
        """(token, count, cursor after it) for each token that followed the cursor's path."""
        node, seq, pos, depth = cursor
        if node is not None:
            children = node.children or {}
            return [(t, c.count, _cursor(c, depth + 1)) for t, c in children.items()]
        if seq is None or pos >= len(seq) or depth >= self.max_depth:
            return []
        return [(seq[pos], 1, (None, seq, pos + 1, depth + 1))]

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of a non-empty pattern of at most max_depth tokens."""
        cursor = self.find(pattern)
        if cursor is None:
            return 0
        return cursor[0].count if cursor[0] is not None else 1

    def continuations(self, pattern: Sequence[int]) -> dict[int, int]:
        """How often each token followed pattern (pattern shorter than max_depth)."""
        cursor = self.find(pattern)
        return {} if cursor is None else {t: c for t, c, _ in self.next_tokens(cursor)}

    def longest_match(self, context: Sequence[int]) -> int:
        """The longest m < max_depth such that context's last m tokens occurred followed by
        a token (0: none). Binary search: if the last m + 1 tokens were followed by something,
        so were the last m, at the same place. [1, 2, 3] held, context [9, 1, 2] -> 2."""
        lo, hi = 0, min(len(context), self.max_depth - 1)
        while lo < hi:
            m = (lo + hi + 1) // 2
            cursor = self.find(context[len(context) - m :])
            if cursor is not None and self.next_tokens(cursor):
                lo = m
            else:
                hi = m - 1
        return lo


def _cursor(node: _TrieNode, depth: int) -> Cursor:
    return (node, None, 0, depth) if node.seq is None else (None, node.seq, node.pos, depth)


def _subtree_size(node: _TrieNode) -> int:
    """Nodes in node's subtree, itself included."""
    size, stack = 0, [node]
    while stack:
        n = stack.pop()
        size += 1
        if n.children:
            stack.extend(n.children.values())
    return size


class CachedOutputs:
    """The global trie over finished requests' outputs: at most max_requests of them, the
    oldest evicted first (and its nodes freed); max_requests 0 keeps none."""

    def __init__(self, max_depth: int, max_requests: int) -> None:
        self.trie = SuffixTrie(max_depth)
        self.max_requests = max_requests
        self._keys: deque[int] = deque()
        self._next_key = 0

    def add(self, tokens: Sequence[int]) -> None:
        """Cache one finished request's output tokens."""
        if self.max_requests == 0 or not tokens:
            return
        key, self._next_key = self._next_key, self._next_key + 1
        self.trie.extend(key, tokens)
        self.trie.close(key)
        self._keys.append(key)
        while len(self._keys) > self.max_requests:
            self.trie.remove(self._keys.popleft())

    def clear(self) -> None:
        """Forget every cached output."""
        while self._keys:
            self.trie.remove(self._keys.popleft())
