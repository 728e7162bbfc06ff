"""CUDA kernels that fill and convert whole arrays: counter-based initialisation (the rule:
:mod:`embtrain.kernels.rules.init`, as on the CPU) and the half arrays' block conversions and
gathers; one thread per element."""

from __future__ import annotations

from numba import cuda

from embtrain.kernels.rules.halves import narrow_nearest, widen
from embtrain.kernels.rules.init import column_stream, init_value, row_hash

__all__ = ["gather_widen_k", "init_k", "narrow_k", "widen_k"]


@cuda.jit
def init_k(out, rows, row_start, use_rows, base, kind, param):
    """``out[i, c] = init(row, c)`` with ``row = rows[i]`` (``use_rows``) or ``row_start + i``;
    one thread per element."""
    i = cuda.grid(1)
    dim = out.shape[1]
    if i >= out.shape[0] * dim:
        return
    ri = i // dim
    c = i - ri * dim
    row = rows[ri] if use_rows else row_start + ri
    out[ri, c] = init_value(
        kind, param, row_hash(base, row), c, column_stream(c, 0), column_stream(c, 1)
    )


@cuda.jit
def narrow_k(dst, src, code):
    """``dst[i, j] = narrow_nearest(src[i, j])``; one thread per element."""
    i = cuda.grid(1)
    cols = src.shape[1]
    if i >= src.shape[0] * cols:
        return
    r = i // cols
    c = i - r * cols
    dst[r, c] = narrow_nearest(src[r, c], code)


@cuda.jit
def widen_k(dst, src, code):
    """``dst[i, j] = widen(src[i, j])``; one thread per element."""
    i = cuda.grid(1)
    cols = src.shape[1]
    if i >= src.shape[0] * cols:
        return
    r = i // cols
    c = i - r * cols
    dst[r, c] = widen(src[r, c], code)


@cuda.jit
def gather_widen_k(src, rows, out, code):
    """``out[i, j] = widen(src[rows[i], j])``; one thread per element of ``out``."""
    i = cuda.grid(1)
    cols = out.shape[1]
    if i >= out.shape[0] * cols:
        return
    r = i // cols
    c = i - r * cols
    out[r, c] = widen(src[rows[r], c], code)
