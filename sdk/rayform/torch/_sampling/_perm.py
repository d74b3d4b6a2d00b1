"""Seeded bijections of ``[0, n)`` that map any position in O(1), without building the order.

A sampler that must jump to position ``p`` of an epoch (to resume, or to tell a read-ahead
what comes next) cannot afford to materialise ``numpy.random.permutation(n)`` for a slice of
a billion samples. :class:`Permutation` is a balanced Feistel network over the smallest
power-of-four domain that holds ``n`` (at most ``4 n``), with cycle walking to stay inside
``[0, n)``: a bijection, so every position maps to a distinct sample. Its round keys come from
BLAKE3 of the caller's tags (seed, epoch, ...), so the order depends on nothing else.
"""

from __future__ import annotations

import numpy as np

from rayform._hashing import hash_bytes

__all__ = ["PassPermutations", "Permutation", "derive_key", "mix64"]

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def derive_key(*tags: object) -> int:
    """A 64-bit key from ``tags`` (joined by NUL and hashed with BLAKE3)."""
    text = "\0".join(str(t) for t in ("rayform-order", *tags))
    return int(hash_bytes(text.encode())[:16], 16)


def mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser over ``uint64 (N,)``: a fast avalanche hash (multiplications
    wrap modulo 2**64, which numpy does silently for arrays)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


class Permutation:
    """A bijection of ``[0, n)`` fixed by a 64-bit ``key``; ``shuffle=False`` is the identity.

    Args:
        n: size of the index space (>= 0).
        key: from :func:`derive_key`.
        shuffle: permute (``True``) or keep positions as they are.
    """

    def __init__(self, n: int, key: int, shuffle: bool = True) -> None:
        self.n = int(n)
        self.shuffle = bool(shuffle) and self.n > 1
        half = max(1, (max(self.n - 1, 1).bit_length() + 1) // 2)
        self._half = np.uint64(half)
        self._mask = np.uint64((1 << half) - 1)
        keys = mix64(np.arange(_ROUNDS, dtype=np.uint64) ^ np.uint64(key & 0xFFFFFFFFFFFFFFFF))
        self._keys = [np.uint64(k) for k in keys]

    def __call__(self, positions: np.ndarray, tweak: np.ndarray | None = None) -> np.ndarray:
        """Map ``positions`` (int array, values in ``[0, n)``) to permuted positions.

        ``tweak`` (int array like ``positions``) selects, per element, one of 2**64 further
        independent permutations (e.g. one per pass over a small source), still vectorised.
        """
        p = np.asarray(positions, dtype=np.int64)
        if not self.shuffle:
            return p.copy()
        t = (
            np.zeros(len(p), np.uint64)
            if tweak is None
            else mix64(np.asarray(tweak).astype(np.uint64))
        )
        y = self._encrypt(p.astype(np.uint64), t)
        out_of_range = y >= np.uint64(self.n)
        # Cycle walking: re-encrypt the few that left [0, n); the cycle through a position
        # below n always returns below n, so this ends (on average in < 4 steps).
        while out_of_range.any():
            y[out_of_range] = self._encrypt(y[out_of_range], t[out_of_range])
            out_of_range = y >= np.uint64(self.n)
        return y.astype(np.int64)

    def inverse(self, values: np.ndarray) -> np.ndarray:
        """The positions that map to ``values`` (values in ``[0, n)``, no tweak): O(1) each.

        Walks the cycle backwards: the forward walk from a position stops at the first value
        below ``n``, so the backward walk from that value stops at the position.
        """
        y = np.asarray(values, dtype=np.int64)
        if not self.shuffle:
            return y.copy()
        x = self._decrypt(y.astype(np.uint64))
        out_of_range = x >= np.uint64(self.n)
        while out_of_range.any():
            x[out_of_range] = self._decrypt(x[out_of_range])
            out_of_range = x >= np.uint64(self.n)
        return x.astype(np.int64)

    def _decrypt(self, y: np.ndarray) -> np.ndarray:
        tweak = np.zeros(len(y), np.uint64)
        left, right = y >> self._half, y & self._mask
        for k in reversed(self._keys):
            left, right = right ^ (mix64(left ^ k ^ tweak) & self._mask), left
        return (left << self._half) | right

    def _encrypt(self, x: np.ndarray, tweak: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for k in self._keys:
            left, right = right, left ^ (mix64(right ^ k ^ tweak) & self._mask)
        return (left << self._half) | right


class PassPermutations:
    """Draws ``j`` over a source of ``n`` samples, pass ``j // n`` its own permutation:
    ``Permutation(n, key)(j % n, tweak=j // n)``."""

    def __init__(self, n: int, key: int) -> None:
        self.n = int(n)
        self._perm = Permutation(self.n, key)

    def __call__(self, draws: np.ndarray) -> np.ndarray:
        passes, within = np.divmod(np.asarray(draws, dtype=np.int64), self.n)
        return self._perm(within, tweak=passes)
