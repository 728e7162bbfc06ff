"""Small LLVM intrinsics for the numba kernels: software prefetch, short vector row ops, and
the vector widening / narrowing of half-precision rows.

numba cannot tell LLVM that two arrays do not alias, so a loop like
``out[i + d] += w * values[j + d]`` stays scalar. These intrinsics emit one vector
load/multiply/add/store instead (IEEE operations, no FMA contraction: results are bit-identical
to the scalar loop). Every index is a flat (int64) element index into a C-contiguous array of any rank; nothing
is bounds-checked.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from embtrain.kernels import numba_cache
from embtrain.kernels.codes import ROUND_NEAREST, ROUND_STOCHASTIC, VAL_BF16, VAL_F16

numba_cache.install()  # before the first @njit(cache=True): compiled code goes to its cache_dir()
_I32 = ir.IntType(32)
_F32 = ir.FloatType()


def _data_ptr(context, builder, aryty, ary, idx):
    arr = context.make_array(aryty)(context, builder, ary)
    return builder.gep(arr.data, [idx])


def _vec_ptr(context, builder, aryty, ary, idx, n):
    ptr = _data_ptr(context, builder, aryty, ary, idx)
    return builder.bitcast(ptr, ir.VectorType(_F32, n).as_pointer())


def _splat(builder, value, n):
    vt = ir.VectorType(_F32, n)
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(_I32, 0))
    mask = ir.Constant(ir.VectorType(_I32, n), [0] * n)
    return builder.shuffle_vector(v, ir.Constant(vt, ir.Undefined), mask)


def _is_c_f32(t) -> bool:
    return isinstance(t, types.Array) and t.dtype == types.float32 and t.layout == "C"


def _make_prefetch(rw: int, locality: int = 3):
    def typer(typingctx, arr, idx):
        if not (
            isinstance(arr, types.Array) and arr.layout == "C" and isinstance(idx, types.Integer)
        ):
            return None
        sig = types.void(arr, idx)

        def codegen(context, builder, signature, args):
            ptr = _data_ptr(context, builder, signature.args[0], args[0], args[1])
            i8p = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            flags = [ir.Constant(_I32, v) for v in (rw, locality, 1)]
            builder.call(fn, [builder.bitcast(ptr, i8p), *flags])
            return context.get_dummy_value()

        return sig, codegen

    return typer


prefetch = intrinsic(_make_prefetch(0))
prefetch.__doc__ = "Hint: fetch flat element ``idx`` of C-contiguous ``arr`` into cache (read)."
prefetch_w = intrinsic(_make_prefetch(1))
prefetch_w.__doc__ = "Hint: fetch flat element ``idx`` of ``arr`` into cache, to be written."


@intrinsic
def cttz(typingctx, x):
    """Number of trailing zero bits of a non-zero uint64."""
    if x != types.uint64:
        return None
    sig = types.uint64(x)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [i64, ir.IntType(1)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.cttz.i64")
        return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 1)])

    return sig, codegen


@intrinsic
def stream16(typingctx, dst, di, src, si):
    """``dst[di:di+16] = src[si:si+16]`` with one non-temporal 64-byte store (``dst`` element
    ``di`` must be 64-byte aligned; ``src`` needs no alignment)."""
    if not (_is_c_f32(dst) and _is_c_f32(src)):
        return None
    sig = types.void(dst, di, src, si)

    def codegen(context, builder, signature, args):
        dp = _vec_ptr(context, builder, signature.args[0], args[0], args[1], 16)
        sp = _vec_ptr(context, builder, signature.args[2], args[2], args[3], 16)
        st = builder.store(builder.load(sp, align=4), dp, align=64)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(_I32, 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_fence(typingctx):
    """``sfence``: order earlier non-temporal stores before later stores."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence"
        )
        builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


def _make_vop(kind: str):
    """Intrinsic for one vector op on ``n`` (literal) float32 lanes."""

    def typer(typingctx, dst, di, src, si, w, n):
        if not (_is_c_f32(dst) and _is_c_f32(src) and isinstance(n, types.IntegerLiteral)):
            return None
        lanes = n.literal_value
        sig = types.void(dst, di, src, si, w, n)

        def codegen(context, builder, signature, args):
            dp = _vec_ptr(context, builder, signature.args[0], args[0], args[1], lanes)
            sp = _vec_ptr(context, builder, signature.args[2], args[2], args[3], lanes)
            wv = _splat(builder, args[4], lanes)
            prod = builder.fmul(wv, builder.load(sp, align=4))
            if kind == "axpy":
                prod = builder.fadd(builder.load(dp, align=4), prod)
            builder.store(prod, dp, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return typer


_vaxpy = intrinsic(_make_vop("axpy"))
_vset = intrinsic(_make_vop("set"))

# The row loops below (and their half twins) assign every variable once (``for`` loops over
# ``range``, one name per tail, no ``d += 16``) and return at one place (the half ones take
# the kind down to the lanes instead of an ``if`` per kind: Python 3.11 gives each branch a
# return of its own, and an inlined call's result is assigned at each). numba inlines them
# into the kernels at the IR level, some through an ``overload(inline="always")``
# (:mod:`embtrain.kernels.halves`) inside an inlined function (``cpu._pool_rows``); a variable
# assigned twice there is renamed by numba's SSA pass in a scope the nested inlining did not
# update, and numba 0.68 printed a ``NumbaIRAssumptionWarning`` for each (1,032 in one
# warm-up). LLVM unrolls both forms alike for the literal widths;
# tests/test_kernel_setup.py compiles these paths and asserts that no warning is emitted.


@njit(cache=True, inline="always")
def axpy(dst, di, src, si, w, n):
    """``dst[di:di+n] += w * src[si:si+n]`` (flat indices), vectorised in 16/8/4 lanes."""
    e16 = n - n % 16
    for d in range(0, e16, 16):
        _vaxpy(dst, di + d, src, si + d, w, 16)
    if n - e16 >= 8:
        _vaxpy(dst, di + e16, src, si + e16, w, 8)
    e8 = e16 + ((n - e16) & 8)
    if n - e8 >= 4:
        _vaxpy(dst, di + e8, src, si + e8, w, 4)
    for j in range(e8 + ((n - e8) & 4), n):
        _vaxpy(dst, di + j, src, si + j, w, 1)


@njit(cache=True, inline="always")
def scale_copy(dst, di, src, si, w, n):
    """``dst[di:di+n] = w * src[si:si+n]`` (flat indices), vectorised in 16/8/4 lanes."""
    e16 = n - n % 16
    for d in range(0, e16, 16):
        _vset(dst, di + d, src, si + d, w, 16)
    if n - e16 >= 8:
        _vset(dst, di + e16, src, si + e16, w, 8)
    e8 = e16 + ((n - e16) & 8)
    if n - e8 >= 4:
        _vset(dst, di + e8, src, si + e8, w, 4)
    for j in range(e8 + ((n - e8) & 4), n):
        _vset(dst, di + j, src, si + j, w, 1)


# ------------------------------------------------------------------ half rows (uint16 patterns)
#
# The vector forms of :mod:`embtrain.kernels.rules.halves` for the CPU kernels' rows
# (:mod:`embtrain.kernels.halves`): ``kind`` (``VAL_BF16``/``VAL_F16``) and ``mode``
# (``ROUND_NEAREST``/``ROUND_STOCHASTIC``) are compile-time literals. Every lane computes
# exactly what the scalar rule computes for its element (integer operations, selects, and for
# float16 subnormals an exact int → float conversion times 2^-24), so results are bit for bit
# those of the rules, NaN payloads included; tests/test_halfrows.py checks every 16-bit
# pattern and the narrowing edges against the NumPy oracle.

_I16 = ir.IntType(16)
_I64 = ir.IntType(64)
_MASK64 = (1 << 64) - 1


def _is_c_u16(t) -> bool:
    return isinstance(t, types.Array) and t.dtype == types.uint16 and t.layout == "C"


def _lit(t) -> int | None:
    return t.literal_value if isinstance(t, types.IntegerLiteral) else None


class _Lanes:
    """IR helpers for ``n``-lane integer vectors (constants splatted)."""

    def __init__(self, builder, n: int):
        self.b = builder
        self.n = n

    def c(self, value: int, ty=_I32):
        value &= (1 << ty.width) - 1
        if value >= 1 << (ty.width - 1):  # LLVM reads integer constants as signed
            value -= 1 << ty.width
        return ir.Constant(ir.VectorType(ty, self.n), [value] * self.n)

    def splat(self, value, ty):
        vt = ir.VectorType(ty, self.n)
        v = self.b.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(_I32, 0))
        return self.b.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                                     ir.Constant(ir.VectorType(_I32, self.n), [0] * self.n))

    def sel(self, cond, a, b):
        return self.b.select(cond, a, b)

    def uge(self, a, b):
        return self.b.icmp_unsigned(">=", a, b)

    def ugt(self, a, b):
        return self.b.icmp_unsigned(">", a, b)

    def eq(self, a, b):
        return self.b.icmp_unsigned("==", a, b)

    def umin(self, a, b):
        return self.b.select(self.b.icmp_unsigned("<", a, b), a, b)


def _widen_lanes(builder, h, kind: int, n: int):
    """``<n x i16>`` half patterns → ``<n x float>`` (``rules.halves.widen``, exact)."""
    v = _Lanes(builder, n)
    b = builder
    vf = ir.VectorType(_F32, n)
    x = b.zext(h, ir.VectorType(_I32, n))
    if kind == VAL_BF16:
        return b.bitcast(b.shl(x, v.c(16)), vf)
    sign = b.shl(b.and_(x, v.c(0x8000)), v.c(16))
    em = b.and_(x, v.c(0x7FFF))
    body = b.add(b.shl(em, v.c(13)), v.c(0x38000000))  # exponent + 112: normal halves
    body = v.sel(v.uge(em, v.c(0x7C00)), b.add(body, v.c(0x38000000)), body)  # inf, NaN
    # subnormal: em · 2^-24 (exact: em < 2^10, the product a normal float32); zero stays 0
    sub = b.fmul(b.uitofp(em, vf), ir.Constant(vf, [2.0**-24] * n))
    body = v.sel(b.icmp_unsigned("<", em, v.c(0x400)), b.bitcast(sub, ir.VectorType(_I32, n)),
                 body)
    return b.bitcast(b.or_(sign, body), vf)


def _nearest_lanes(v: _Lanes, bits, kind: int):
    """``<n x i32>`` float32 patterns → ``<n x i32>`` half patterns rounded to nearest
    (``rules.halves._nearest_bits``)."""
    b = v.b
    a = b.and_(bits, v.c(0x7FFFFFFF))
    sign = b.and_(b.lshr(bits, v.c(16)), v.c(0x8000))
    is_nan = v.ugt(a, v.c(0x7F800000))
    if kind == VAL_BF16:
        odd = b.and_(b.lshr(bits, v.c(16)), v.c(1))
        rounded = b.lshr(b.add(b.add(bits, v.c(0x7FFF)), odd), v.c(16))
        return v.sel(is_nan, b.or_(sign, v.c(0x7FC0)), rounded)
    nan = b.add(v.c(0x7C00), b.lshr(b.and_(bits, v.c(0x7FFFFF)), v.c(13)))
    nan = v.sel(v.eq(nan, v.c(0x7C00)), v.c(0x7C01), nan)
    odd = b.and_(b.lshr(a, v.c(13)), v.c(1))
    normal = b.lshr(b.sub(b.add(b.add(a, v.c(0xFFF)), odd), v.c(0x38000000)), v.c(13))
    # subnormal results: 2^-25 < |x| < 2^-14, s = 126 - e in 14 … 24 (e clamped so that other
    # lanes shift by a valid amount; their result is not selected)
    e = b.lshr(a, v.c(23))
    e = v.sel(v.ugt(e, v.c(112)), v.c(112), e)
    e = v.sel(b.icmp_unsigned("<", e, v.c(102)), v.c(102), e)
    s = b.sub(v.c(126), e)
    m = b.or_(b.and_(a, v.c(0x7FFFFF)), v.c(0x800000))
    h = b.lshr(m, s)
    rem = b.and_(m, b.sub(b.shl(v.c(1), s), v.c(1)))
    half = b.shl(v.c(1), b.sub(s, v.c(1)))
    up = b.or_(v.ugt(rem, half), b.and_(v.eq(rem, half), v.eq(b.and_(h, v.c(1)), v.c(1))))
    sub = b.add(h, b.zext(up, ir.VectorType(_I32, v.n)))
    res = v.sel(v.ugt(a, v.c(0x33000000)), sub, v.c(0))
    res = v.sel(v.uge(a, v.c(0x38800000)), normal, res)
    res = v.sel(v.uge(a, v.c(0x477FF000)), v.c(0x7C00), res)
    res = v.sel(is_nan, nan, res)
    return b.or_(sign, res)


def _mix64_lanes(v: _Lanes, z):
    """``rules.hashing.mix64`` on ``<n x i64>``."""
    b = v.b
    z = b.add(z, v.c(0x9E3779B97F4A7C15, _I64))
    z = b.mul(b.xor(z, b.lshr(z, v.c(30, _I64))), v.c(0xBF58476D1CE4E5B9, _I64))
    z = b.mul(b.xor(z, b.lshr(z, v.c(27, _I64))), v.c(0x94D049BB133111EB, _I64))
    return b.xor(z, b.lshr(z, v.c(31, _I64)))


def _stochastic_lanes(v: _Lanes, bits, kind: int, rh, c0):
    """``<n x i32>`` float32 patterns → half patterns rounded stochastically with
    ``round_col(rh, c0 + lane)`` (``rules.halves._stochastic_bits``)."""
    b = v.b
    v64 = ir.VectorType(_I64, v.n)
    cols = b.add(v.splat(c0, _I64), ir.Constant(v64, list(range(v.n))))
    r64 = b.lshr(_mix64_lanes(v, b.xor(v.splat(rh, _I64), cols)), v.c(32, _I64))
    r = b.trunc(r64, ir.VectorType(_I32, v.n))
    a = b.and_(bits, v.c(0x7FFFFFFF))
    special = v.uge(a, v.c(0x7F800000))
    nearest = _nearest_lanes(v, bits, kind)
    if kind == VAL_BF16:
        return v.sel(special, nearest, b.lshr(b.add(bits, b.and_(r, v.c(0xFFFF))), v.c(16)))
    sign = b.and_(b.lshr(bits, v.c(16)), v.c(0x8000))
    a2 = b.add(a, b.and_(r, v.c(0x1FFF)))
    normal = v.sel(v.uge(a2, v.c(0x47800000)), v.c(0x7C00),
                   b.lshr(b.sub(a2, v.c(0x38000000)), v.c(13)))
    # subnormal results, in 64 bits: m + (r mod 2^s) >> s, s ≤ 32 after a pre-shift
    e = b.lshr(a, v.c(23))
    is0 = v.eq(e, v.c(0))
    m = b.zext(v.sel(is0, a, b.or_(b.and_(a, v.c(0x7FFFFF)), v.c(0x800000))), v64)
    s = v.sel(is0, v.c(125), b.sub(v.c(126), v.umin(e, v.c(126))))
    s = b.zext(s, v64)
    big = v.ugt(s, v.c(32, _I64))
    m = b.lshr(m, v.sel(big, v.umin(b.sub(s, v.c(32, _I64)), v.c(63, _I64)), v.c(0, _I64)))
    s = v.sel(big, v.c(32, _I64), s)
    low = b.and_(r64, b.sub(b.shl(v.c(1, _I64), s), v.c(1, _I64)))
    sub = b.trunc(b.lshr(b.add(m, low), s), ir.VectorType(_I32, v.n))
    res = v.sel(v.uge(a, v.c(0x38800000)), normal, sub)
    return v.sel(special, nearest, b.or_(sign, res))


def _half_ptr(context, builder, aryty, ary, idx, n):
    ptr = _data_ptr(context, builder, aryty, ary, idx)
    return builder.bitcast(ptr, ir.VectorType(_I16, n).as_pointer())


def _make_half_vop(kind_of_op: str):
    """Intrinsic ``(dst, di, src, si, w, n, kind)``: ``n`` float32 lanes of ``dst`` set to
    (``set``) or incremented by (``axpy``) ``w * widen(src[si:si+n])``. ``kind`` a literal
    (``VAL_BF16``/``VAL_F16``): that widening; a runtime integer: both, behind one branch on
    it (an LLVM branch, so that the callers need no ``if`` on the kind: see the note above
    :func:`axpy`)."""

    def typer(typingctx, dst, di, src, si, w, n, kind):
        lanes, k = _lit(n), _lit(kind)
        runtime_kind = k is None and isinstance(kind, types.Integer)
        if not (_is_c_f32(dst) and _is_c_u16(src) and lanes
                and (k in (VAL_BF16, VAL_F16) or runtime_kind)):
            return None
        sig = types.void(dst, di, src, si, w, n, kind)

        def emit(context, builder, signature, args, widen_kind):
            dp = _vec_ptr(context, builder, signature.args[0], args[0], args[1], lanes)
            sp = _half_ptr(context, builder, signature.args[2], args[2], args[3], lanes)
            x = _widen_lanes(builder, builder.load(sp, align=2), widen_kind, lanes)
            prod = builder.fmul(_splat(builder, args[4], lanes), x)
            if kind_of_op == "axpy":
                prod = builder.fadd(builder.load(dp, align=4), prod)
            builder.store(prod, dp, align=4)

        def codegen(context, builder, signature, args):
            if not runtime_kind:
                emit(context, builder, signature, args, k)
                return context.get_dummy_value()
            is_bf16 = builder.icmp_signed("==", args[6], ir.Constant(args[6].type, VAL_BF16))
            with builder.if_else(is_bf16, likely=None) as (bf16, f16):
                with bf16:
                    emit(context, builder, signature, args, VAL_BF16)
                with f16:
                    emit(context, builder, signature, args, VAL_F16)
            return context.get_dummy_value()

        return sig, codegen

    return typer


_vhaxpy = intrinsic(_make_half_vop("axpy"))
_vhset = intrinsic(_make_half_vop("set"))


@intrinsic
def _vhwiden(typingctx, dst, di, src, si, n, kind):
    """``dst[di:di+n] = widen(src[si:si+n])`` (float32 from half patterns, exact)."""
    lanes, k = _lit(n), _lit(kind)
    if not (_is_c_f32(dst) and _is_c_u16(src) and lanes and k in (VAL_BF16, VAL_F16)):
        return None
    sig = types.void(dst, di, src, si, n, kind)

    def codegen(context, builder, signature, args):
        dp = _vec_ptr(context, builder, signature.args[0], args[0], args[1], lanes)
        sp = _half_ptr(context, builder, signature.args[2], args[2], args[3], lanes)
        builder.store(_widen_lanes(builder, builder.load(sp, align=2), k, lanes), dp, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _vhnarrow(typingctx, dst, di, src, si, n, kind, mode, rh, c0):
    """``dst[di+j] = narrow(src[si+j])`` for ``j < n``: to nearest, or stochastically with
    ``round_col(rh, c0 + j)`` (``rh`` uint64, ``c0`` int64; ignored for nearest)."""
    lanes, k, md = _lit(n), _lit(kind), _lit(mode)
    if not (_is_c_u16(dst) and _is_c_f32(src) and lanes and k in (VAL_BF16, VAL_F16)
            and md in (ROUND_NEAREST, ROUND_STOCHASTIC)
            and isinstance(rh, types.Integer) and isinstance(c0, types.Integer)):
        return None
    sig = types.void(dst, di, src, si, n, kind, mode, rh, c0)

    def codegen(context, builder, signature, args):
        v = _Lanes(builder, lanes)
        sp = _vec_ptr(context, builder, signature.args[2], args[2], args[3], lanes)
        bits = builder.bitcast(builder.load(sp, align=4), ir.VectorType(_I32, lanes))
        if md == ROUND_NEAREST:
            h = _nearest_lanes(v, bits, k)
        else:
            h = _stochastic_lanes(v, bits, k, args[7], args[8])
        dp = _half_ptr(context, builder, signature.args[0], args[0], args[1], lanes)
        builder.store(builder.trunc(h, ir.VectorType(_I16, lanes)), dp, align=2)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, inline="always")
def _half_axpy_k(dst, di, src, si, w, n, kind):
    e16 = n - n % 16
    for d in range(0, e16, 16):
        _vhaxpy(dst, di + d, src, si + d, w, 16, kind)
    if n - e16 >= 8:
        _vhaxpy(dst, di + e16, src, si + e16, w, 8, kind)
    e8 = e16 + ((n - e16) & 8)
    if n - e8 >= 4:
        _vhaxpy(dst, di + e8, src, si + e8, w, 4, kind)
    for j in range(e8 + ((n - e8) & 4), n):
        _vhaxpy(dst, di + j, src, si + j, w, 1, kind)


@njit(cache=True, inline="always")
def _half_scale_copy_k(dst, di, src, si, w, n, kind):
    e16 = n - n % 16
    for d in range(0, e16, 16):
        _vhset(dst, di + d, src, si + d, w, 16, kind)
    if n - e16 >= 8:
        _vhset(dst, di + e16, src, si + e16, w, 8, kind)
    e8 = e16 + ((n - e16) & 8)
    if n - e8 >= 4:
        _vhset(dst, di + e8, src, si + e8, w, 4, kind)
    for j in range(e8 + ((n - e8) & 4), n):
        _vhset(dst, di + j, src, si + j, w, 1, kind)


@njit(cache=True, inline="always")
def _half_widen_k(dst, di, src, si, n, kind):
    e16 = n - n % 16
    for d in range(0, e16, 16):
        _vhwiden(dst, di + d, src, si + d, 16, kind)
    if n - e16 >= 8:
        _vhwiden(dst, di + e16, src, si + e16, 8, kind)
    e8 = e16 + ((n - e16) & 8)
    if n - e8 >= 4:
        _vhwiden(dst, di + e8, src, si + e8, 4, kind)
    for j in range(e8 + ((n - e8) & 4), n):
        _vhwiden(dst, di + j, src, si + j, 1, kind)


@njit(cache=True, inline="always")
def _half_narrow_k(dst, di, src, si, n, kind, mode, rh, c0):
    e16 = n - n % 16
    for d in range(0, e16, 16):
        _vhnarrow(dst, di + d, src, si + d, 16, kind, mode, rh, c0 + d)
    if n - e16 >= 8:
        _vhnarrow(dst, di + e16, src, si + e16, 8, kind, mode, rh, c0 + e16)
    e8 = e16 + ((n - e16) & 8)
    if n - e8 >= 4:
        _vhnarrow(dst, di + e8, src, si + e8, 4, kind, mode, rh, c0 + e8)
    for j in range(e8 + ((n - e8) & 4), n):
        _vhnarrow(dst, di + j, src, si + j, 1, kind, mode, rh, c0 + j)


@njit(cache=True, inline="always")
def half_axpy(dst, di, src, si, w, n, code):
    """``dst[di:di+n] += w * widen(src[si:si+n])`` (float32 ``dst``, half patterns ``src`` of
    ``code``; flat indices), vectorised in 16/8/4 lanes. ``code`` goes down to the lanes (one
    branch there), not into an ``if`` here: two returns here made numba warn where this is
    inlined through :func:`embtrain.kernels.halves.row_axpy` (the note above :func:`axpy`)."""
    _half_axpy_k(dst, di, src, si, w, n, code)


@njit(cache=True, inline="always")
def half_scale_copy(dst, di, src, si, w, n, code):
    """``dst[di:di+n] = w * widen(src[si:si+n])`` (as :func:`half_axpy`)."""
    _half_scale_copy_k(dst, di, src, si, w, n, code)


@njit(cache=True, inline="always")
def half_widen(dst, di, src, si, n, code):
    """``dst[di:di+n] = widen(src[si:si+n])`` (exact, NaN payloads kept)."""
    if code == VAL_BF16:
        _half_widen_k(dst, di, src, si, n, VAL_BF16)
    else:
        _half_widen_k(dst, di, src, si, n, VAL_F16)


@njit(cache=True, inline="always")
def half_narrow(dst, di, src, si, n, code, rmode, rh, c0):
    """``dst[di:di+n] = narrow(src[si:si+n])`` (half patterns ``dst`` of ``code`` from float32
    ``src``): to nearest, or (``rmode`` ``ROUND_STOCHASTIC``) with the random bits
    ``round_col(rh, c0 + j)`` for element ``j``; bit for bit the scalar rules."""
    if code == VAL_BF16:
        if rmode == ROUND_NEAREST:
            _half_narrow_k(dst, di, src, si, n, VAL_BF16, ROUND_NEAREST, rh, c0)
        else:
            _half_narrow_k(dst, di, src, si, n, VAL_BF16, ROUND_STOCHASTIC, rh, c0)
    elif rmode == ROUND_NEAREST:
        _half_narrow_k(dst, di, src, si, n, VAL_F16, ROUND_NEAREST, rh, c0)
    else:
        _half_narrow_k(dst, di, src, si, n, VAL_F16, ROUND_STOCHASTIC, rh, c0)


@njit(cache=True, inline="always")
def half_narrow_nearest(dst, di, src, si, n, code):
    """:func:`half_narrow` to nearest (ties to even) only, so that a kernel that never rounds
    stochastically compiles one rounding mode (the pooled vectors handed to a network that
    computes in ``code``'s type)."""
    if code == VAL_BF16:
        _half_narrow_k(dst, di, src, si, n, VAL_BF16, ROUND_NEAREST, 0, 0)
    else:
        _half_narrow_k(dst, di, src, si, n, VAL_F16, ROUND_NEAREST, 0, 0)


@njit(cache=True, inline="always")
def bf16_axpy(dst, di, src, si, w, n):
    """``dst[di:di+n] += w * widen(src[si:si+n])`` for bfloat16 patterns ``src`` (as
    :func:`half_axpy`, one type compiled): a gradient a bfloat16 network returned."""
    _half_axpy_k(dst, di, src, si, w, n, VAL_BF16)


@njit(cache=True, inline="always")
def bf16_scale_copy(dst, di, src, si, w, n):
    """``dst[di:di+n] = w * widen(src[si:si+n])`` for bfloat16 patterns ``src``."""
    _half_scale_copy_k(dst, di, src, si, w, n, VAL_BF16)
