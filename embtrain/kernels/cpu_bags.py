"""Bags of keys as the CPU kernels read them: where a bag starts, whether a run of bags is
one key each, and the software prefetch distance (shared by :mod:`.cpu_pool` and
:mod:`.cpu_update`)."""

from __future__ import annotations

from numba import njit

from embtrain.kernels import numba_cache, typed_lists

numba_cache.install()  # before the first @njit(cache=True): compiled code goes to its cache_dir()
typed_lists.install()  # typed lists built from Python: numba's helpers from that cache too


#: software prefetch distance, in keys or rows
PREFETCH = 32

@njit(cache=True, inline="always")
def bag_start(offs, bag, b):
    """Position of bag ``b``'s first key: ``b * bag`` for a fixed bag size, else ``offs[b]``."""
    return b * bag if bag > 0 else offs[b]


@njit(cache=True, inline="always")
def is_one_hot(offs, bag, b0, b1, nnz):
    """True if every bag ``b0 <= b < b1`` holds exactly key ``b``: ``bag == 1``, or
    (``bag == 0``) ``offs[b] == b`` throughout."""
    if b1 > nnz:
        return False
    if bag > 0:
        return bag == 1
    for b in range(b0, b1 + 1):  # noqa: SIM110 (numba: no generator in all())
        if offs[b] != b:
            return False
    return True


