"""Small LLVM intrinsics for the numba kernels: software prefetch and short vector row ops.

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


@njit(cache=True, inline="always")
def axpy(dst, di, src, si, w, n):
    """``dst[di:di+n] += w * src[si:si+n]`` (flat indices), vectorised in 16/8/4 lanes."""
    d = 0
    while d + 16 <= n:
        _vaxpy(dst, di + d, src, si + d, w, 16)
        d += 16
    if d + 8 <= n:
        _vaxpy(dst, di + d, src, si + d, w, 8)
        d += 8
    if d + 4 <= n:
        _vaxpy(dst, di + d, src, si + d, w, 4)
        d += 4
    while d < n:
        _vaxpy(dst, di + d, src, si + d, w, 1)
        d += 1


@njit(cache=True, inline="always")
def scale_copy(dst, di, src, si, w, n):
    """``dst[di:di+n] = w * src[si:si+n]`` (flat indices), vectorised in 16/8/4 lanes."""
    d = 0
    while d + 16 <= n:
        _vset(dst, di + d, src, si + d, w, 16)
        d += 16
    if d + 8 <= n:
        _vset(dst, di + d, src, si + d, w, 8)
        d += 8
    if d + 4 <= n:
        _vset(dst, di + d, src, si + d, w, 4)
        d += 4
    while d < n:
        _vset(dst, di + d, src, si + d, w, 1)
        d += 1
