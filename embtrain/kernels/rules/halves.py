"""Half-precision tables: float32 ⇄ bfloat16 / float16 conversions and the counter-based
random bits of stochastic rounding (one definition, every target).

A half table stores the 16-bit patterns in an ``np.uint16`` array, for both kinds
(``codes.VAL_BF16``, ``codes.VAL_F16``). Kernels load, :func:`widen` to float32, compute in
float32 and narrow back with :func:`narrow_nearest` (round to nearest, ties to even) or
:func:`narrow_stochastic` (stochastic rounding with 32 random bits from :func:`round_bits`).

Rules (all bit-exact, the NumPy oracle is :mod:`embtrain.embedding.reference_halves`):

* :func:`widen` is exact: bfloat16 is the top half of a float32 (a shift); float16 keeps
  subnormals, ±inf and NaN payloads (``mant << 13``), as NumPy's ``astype(np.float32)``.
* :func:`narrow_nearest` equals NumPy's ``np.float32(x).astype(np.float16)`` (overflow to ±inf,
  subnormals, a NaN keeps the top of its payload and stays a NaN) and ``ml_dtypes.bfloat16``'s
  conversion (a NaN becomes the quiet NaN ``0x7FC0`` with its sign).
* :func:`narrow_stochastic` truncates ``|x|`` toward zero to the half grid and adds one unit
  of the last place with probability ``(dropped bits) / 2^s``, decided by the low ``s`` bits of
  ``rbits``: ``s = 16`` for bfloat16, ``13`` for normal float16 results and ``126 - e`` (``e``:
  the float32 biased exponent) for float16 subnormal results, at most 32 (below ``2^-32`` the
  value is first truncated to ``2^-56``, the only bias: less than ``2^-32`` of an ulp). So
  ``E[widen(narrow_stochastic(x))] == x`` for every finite ``x`` below the largest finite half
  (beyond it the rounding reaches ±inf). ±inf and NaN narrow as :func:`narrow_nearest`.
* :func:`round_bits` of (seed, step, table, key, column) is a 32-bit hash (:func:`mix64`
  chain): the same element of the same table at the same step draws the same bits whatever the
  number of threads or ranks. A kernel computes :func:`round_base` once per (table, step),
  :func:`round_row` once per row and :func:`round_col` per element; an optimizer slot stored in
  the table's dtype draws from :func:`slot_column` (another stream than the value's).

Float32 bits are read and written with NumPy's scalar ``view`` (a bitcast when compiled, for
the CPU and the CUDA target alike; plain NumPy under the CUDA simulator). Integer arithmetic is
int64 throughout, so numba's integer promotion and NumPy's scalars agree.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numba.extending import register_jitable

from embtrain.kernels.codes import VAL_BF16
from embtrain.kernels.rules.hashing import mix64, mix64_int

#: Separates the rounding streams from every other use of :func:`mix64` on the seed.
ROUND_SALT = 0x5EED_0F_5A_1D_0B17
_SALT = np.uint64(ROUND_SALT)
_S32 = np.uint64(32)
#: :func:`slot_column` puts slot ``s``'s stream at ``column + (s + 1) << SLOT_STREAM_SHIFT``.
SLOT_STREAM_SHIFT = 32


# ----------------------------------------------------------------------------- bit casts


@register_jitable(inline="always")
def f32_bits(x):
    """The bit pattern of float32 ``x`` as an int64 in ``[0, 2^32)``."""
    return np.int64(np.float32(x).view(np.uint32))


@register_jitable(inline="always")
def bits_f32(b):
    """The float32 whose bit pattern is the low 32 bits of ``b`` (an int64 ≥ 0)."""
    return np.uint32(b).view(np.float32)


# ----------------------------------------------------------------------------- widen


@register_jitable(inline="always")
def widen_f16_bits(h):
    """float32 bit pattern (int64) of the float16 pattern ``h`` (exact)."""
    sign = (h & 0x8000) << 16
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    if exp == 0x1F:  # inf, NaN (payload kept, as NumPy)
        return sign | 0x7F800000 | (mant << 13)
    if exp != 0:
        return sign | ((exp + 112) << 23) | (mant << 13)
    if mant == 0:
        return sign
    # subnormal: mant · 2^-24 is a normal float32; normalise the mantissa
    e = 113
    while (mant & 0x400) == 0:
        mant <<= 1
        e -= 1
    return sign | (e << 23) | ((mant & 0x3FF) << 13)


@register_jitable(inline="always")
def widen(bits, kind):
    """The float32 value of the half pattern ``bits`` (uint16) of ``kind``
    (``VAL_BF16``/``VAL_F16``); exact."""
    h = np.int64(bits)
    if kind == VAL_BF16:
        return bits_f32(h << 16)
    return bits_f32(widen_f16_bits(h))


# ----------------------------------------------------------------------------- narrow


@register_jitable(inline="always")
def _nan_half(b, kind):
    """The half NaN of the float32 NaN pattern ``b`` (NumPy's for float16, ml_dtypes' quiet
    NaN for bfloat16)."""
    sign = (b >> 16) & 0x8000
    if kind == VAL_BF16:
        return sign | 0x7FC0
    h = 0x7C00 + ((b & 0x7FFFFF) >> 13)
    if h == 0x7C00:
        h = 0x7C01
    return sign | h


@register_jitable
def _nearest_bits(b, kind):
    """Round-to-nearest-even half pattern (int64) of the float32 pattern ``b``."""
    a = b & 0x7FFFFFFF
    if a > 0x7F800000:
        return _nan_half(b, kind)
    if kind == VAL_BF16:
        return (b + 0x7FFF + ((b >> 16) & 1)) >> 16  # carries reach inf, never the sign
    sign = (b >> 16) & 0x8000
    if a >= 0x477FF000:  # ≥ 65520 (the tie above 65504 rounds to even: inf), or inf
        return sign | 0x7C00
    if a >= 0x38800000:  # ≥ 2^-14: a normal float16
        return sign | ((a + 0xFFF + ((a >> 13) & 1) - 0x38000000) >> 13)
    if a <= 0x33000000:  # ≤ 2^-25 (the tie rounds to even: zero)
        return sign
    s = 126 - (a >> 23)  # 14 … 24 bits dropped
    m = (a & 0x7FFFFF) | 0x800000
    h = m >> s
    rem = m & ((np.int64(1) << s) - 1)
    half = np.int64(1) << (s - 1)
    if rem > half or (rem == half and (h & 1) != 0):
        h += 1  # may become 0x400, the smallest normal: correct
    return sign | h


@register_jitable(inline="always")
def narrow_nearest(x, kind):
    """float32 ``x`` rounded to the nearest half of ``kind`` (ties to even), as uint16."""
    return np.uint16(_nearest_bits(f32_bits(x), kind))


@register_jitable
def _stochastic_bits(b, kind, r):
    """Stochastically rounded half pattern (int64) of the float32 pattern ``b`` with the
    random bits ``r`` (int64 in ``[0, 2^32)``)."""
    a = b & 0x7FFFFFFF
    if a >= 0x7F800000:
        return _nearest_bits(b, kind)
    if kind == VAL_BF16:
        return (b + (r & 0xFFFF)) >> 16
    sign = (b >> 16) & 0x8000
    if a >= 0x38800000:  # a normal float16 result, or overflow
        a += r & 0x1FFF
        if a >= 0x47800000:  # ≥ 65536
            return sign | 0x7C00
        return sign | ((a - 0x38000000) >> 13)
    e = a >> 23
    if e == 0:  # a float32 subnormal: mant · 2^-149 = mant · 2^-125 float16 ulps
        m = a
        s = np.int64(125)
    else:
        m = (a & 0x7FFFFF) | 0x800000
        s = 126 - e
    if s > 32:
        # at most 63: a compiled int64 shift by 64 or more is undefined (x86 takes the count
        # mod 64: below 2^-96, m kept whole rounded up to 2^-24 with probability m / 2^32)
        m >>= min(s - 32, np.int64(63))
        s = np.int64(32)
    return sign | ((m + (r & ((np.int64(1) << s) - 1))) >> s)


@register_jitable(inline="always")
def narrow_stochastic(x, kind, rbits):
    """float32 ``x`` rounded stochastically to a half of ``kind`` with the 32 random bits
    ``rbits`` (uint32, :func:`round_bits`), as uint16 (see the module's rules)."""
    return np.uint16(_stochastic_bits(f32_bits(x), kind, np.int64(rbits)))


# ----------------------------------------------------------------------------- random bits


@register_jitable(inline="always")
def round_base(seed, step, table):
    """The rounding stream of (``seed``, ``step``, ``table``) (uint64 each): once per table and
    step."""
    return mix64(mix64(mix64(np.uint64(seed) ^ _SALT) ^ np.uint64(step)) ^ np.uint64(table))


@register_jitable(inline="always")
def round_row(base, key):
    """The stream of one row (``key``: the row's key, int64 taken mod 2^64) of a table."""
    return mix64(base ^ mix64(np.uint64(key)))


@register_jitable(inline="always")
def round_col(rh, column):
    """32 random bits of ``column`` of the row whose stream is ``rh``."""
    return np.uint32(mix64(rh ^ np.uint64(column)) >> _S32)


@register_jitable(inline="always")
def slot_column(column, slot):
    """The ``column`` of optimizer slot ``slot`` (0, 1) in the rounding streams."""
    return np.int64(column) + (np.int64(slot + 1) << SLOT_STREAM_SHIFT)


@register_jitable(inline="always")
def round_bits(seed, step, table, key, column):
    """32 random bits (uint32) for narrowing element (``key``, ``column``) of ``table`` at
    ``step`` of a run seeded ``seed``."""
    return round_col(round_row(round_base(seed, step, table), key), column)


# ----------------------------------------------------------------------------- host helpers


def round_base_int(seed: int, step: int, table: int) -> int:
    """:func:`round_base` of Python integers (each taken mod 2^64), as a Python integer."""
    m = 0xFFFFFFFFFFFFFFFF
    z = mix64_int((seed & m) ^ ROUND_SALT)
    return mix64_int(mix64_int(z ^ (step & m)) ^ (table & m))


def round_table_id(name: str) -> int:
    """The ``table`` of :func:`round_bits` for a table called ``name`` (a 64-bit hash of the
    name: the same on every rank, whatever the table's position in its group)."""
    digest = hashlib.blake2b(b"round:" + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
