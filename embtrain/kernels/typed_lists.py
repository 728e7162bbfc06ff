"""numba's typed-list helpers, compiled once and cached with the kernels.

The CPU kernels take their per-feature and per-table arrays as ``numba.typed.List``. Building
one from Python calls small jitted helpers of :mod:`numba.typed.typedlist` (make, append,
length, item), which numba declares without ``cache=True``: every process compiled them again
for every item type it met (0.6 s in a quickstart run, 1.4 s with dynamic tables; measured in
docs/PERFORMANCE.md, "start-up"), in every ``embtrain run`` rank, ``bench`` and ``predict``,
before a step ran. Here the same helpers (the same bodies as numba's) are declared with ``cache=True`` in a
kernel source (:data:`~embtrain.kernels.numba_cache.KERNEL_SOURCES`), so they are compiled by
the warm-up and loaded from the kernel cache, and :func:`install` puts them in the place of
numba's. Lists built either way are the same objects; only where their code comes from
changes.
"""

from __future__ import annotations

from numba import njit
from numba.typed import listobject, typedlist

from embtrain.kernels import numba_cache

numba_cache.install()

__all__ = ["install"]


@njit(cache=True)
def _make_list(itemty, allocated=typedlist.DEFAULT_ALLOCATED):  # type: ignore[no-untyped-def]
    return listobject._as_meminfo(listobject.new_list(itemty, allocated=allocated))


@njit(cache=True)
def _length(lst):  # type: ignore[no-untyped-def]
    return len(lst)


@njit(cache=True)
def _append(lst, item):  # type: ignore[no-untyped-def]
    lst.append(item)


@njit(cache=True)
def _getitem(lst, i):  # type: ignore[no-untyped-def]
    return lst[i]


@njit(cache=True)
def _setitem(lst, i, item):  # type: ignore[no-untyped-def]
    lst[i] = item


#: numba's helper name -> its cached twin; the ones the engine's lists use from Python
CACHED = {"_make_list": _make_list, "_length": _length, "_append": _append,
          "_getitem": _getitem, "_setitem": _setitem}


def install() -> None:
    """Use the cached helpers for every typed list built from Python (idempotent)."""
    for name, helper in CACHED.items():
        setattr(typedlist, name, helper)
