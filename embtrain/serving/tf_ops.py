"""What training computes in numba, written in TensorFlow ops for a SavedModel.

- :func:`xxh64`: the string-id hash of :mod:`embtrain.data.kernels` (XXH64, seed 0, over the
  UTF-8 bytes, as int64), vectorised over a batch of strings with ``uint64`` arithmetic
  (TensorFlow's uint64 add/multiply wrap around like C's). TensorFlow has no xxHash64 op.
- :func:`initial_values`: the counter-based initializer of
  :mod:`embtrain.embedding.initializers` (what a dynamic table with ``missing: initial`` reads
  for a key it does not hold), following :func:`embtrain.embedding.reference.init_reference`.

Only TensorFlow is imported here at run time: a SavedModel's functions are traced from these.
"""

from __future__ import annotations

import tensorflow as tf

_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P3 = 1609587929392839161
_P4 = 9650029242287828579
_P5 = 2870177450012600261


def _u(value: int) -> tf.Tensor:
    return tf.constant(value, tf.uint64)


def _shl(x: tf.Tensor, r: int) -> tf.Tensor:
    return tf.bitwise.left_shift(x, _u(r))


def _shr(x: tf.Tensor, r: int) -> tf.Tensor:
    return tf.bitwise.right_shift(x, _u(r))


def _xor(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    return tf.bitwise.bitwise_xor(a, b)


def _rotl(x: tf.Tensor, r: int) -> tf.Tensor:
    return tf.bitwise.bitwise_or(_shl(x, r), _shr(x, 64 - r))


def _round(acc: tf.Tensor, lane: tf.Tensor) -> tf.Tensor:
    return _rotl(acc + lane * _u(_P2), 31) * _u(_P1)


def _merge(acc: tf.Tensor, val: tf.Tensor) -> tf.Tensor:
    return _xor(acc, _round(tf.zeros_like(val), val)) * _u(_P1) + _u(_P4)


def xxh64(strings: tf.Tensor) -> tf.Tensor:
    """XXH64 (seed 0) of every string of a 1-D ``tf.string`` tensor, as int64 ``[n]``."""
    strings = tf.reshape(strings, [-1])
    lengths = tf.cast(tf.strings.length(strings), tf.int64)  # bytes
    longest = tf.maximum(tf.reduce_max(tf.concat([lengths, [0]], 0)), 0)
    width = (longest // 32 + 2) * 32  # room to read a whole stripe or word past any end
    raw = tf.io.decode_raw(strings, tf.uint8, fixed_length=tf.cast(width, tf.int32))
    raw = tf.reshape(raw, [-1, width])
    b = tf.cast(raw, tf.uint64)
    quads = tf.reshape(b, [tf.shape(b)[0], -1, 4])
    w32 = (quads[:, :, 0] | _shl(quads[:, :, 1], 8) | _shl(quads[:, :, 2], 16)
           | _shl(quads[:, :, 3], 24))  # little-endian 32-bit words, [n, width / 4]
    w64 = w32[:, 0::2] | _shl(w32[:, 1::2], 32)  # aligned 64-bit words, [n, width / 8]
    stripes = tf.where(lengths >= 32, lengths // 32, 0)
    n = tf.shape(strings)[0]
    zero = tf.zeros([n], tf.uint64)
    v = (zero + _u((_P1 + _P2) % 2**64), zero + _u(_P2), zero, zero - _u(_P1))

    def body(k: tf.Tensor, v1: tf.Tensor, v2: tf.Tensor, v3: tf.Tensor, v4: tf.Tensor
             ) -> tuple[tf.Tensor, ...]:
        lanes = tf.gather(w64, tf.range(4 * k, 4 * k + 4), axis=1)
        on = k < stripes
        out = [tf.where(on, _round(acc, lanes[:, i]), acc)
               for i, acc in enumerate((v1, v2, v3, v4))]
        return (k + 1, *out)

    max_stripes = tf.reduce_max(tf.concat([stripes, [0]], 0))
    _, v1, v2, v3, v4 = tf.while_loop(lambda k, *_: k < max_stripes, body,
                                      (tf.constant(0, tf.int64), *v))
    long = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
    for acc in (v1, v2, v3, v4):
        long = _merge(long, acc)
    h = tf.where(lengths >= 32, long, zero + _u(_P5)) + tf.cast(lengths, tf.uint64)

    def word32(index: tf.Tensor) -> tf.Tensor:
        return tf.gather(w32, index[:, None], batch_dims=1)[:, 0]

    p = stripes * 32  # bytes consumed, a multiple of 4 from here on
    rest = lengths - p
    for j in range(3):  # up to three 8-byte words
        on = rest >= 8 * (j + 1)
        at = (p + 8 * j) // 4
        lane = word32(at) | _shl(word32(at + 1), 32)
        mixed = _rotl(_xor(h, _round(zero, lane)), 27) * _u(_P1) + _u(_P4)
        h = tf.where(on, mixed, h)
    p = p + 8 * (rest // 8)
    rest = rest % 8
    on = rest >= 4
    mixed = _rotl(_xor(h, word32(p // 4) * _u(_P1)), 23) * _u(_P2) + _u(_P3)
    h = tf.where(on, mixed, h)
    p = tf.where(on, p + 4, p)
    rest = rest % 4
    for j in range(3):  # up to three single bytes
        byte = tf.gather(b, (p + j)[:, None], batch_dims=1)[:, 0]
        mixed = _rotl(_xor(h, byte * _u(_P5)), 11) * _u(_P1)
        h = tf.where(rest > j, mixed, h)
    h = _xor(h, _shr(h, 33)) * _u(_P2)
    h = _xor(h, _shr(h, 29)) * _u(_P3)
    h = _xor(h, _shr(h, 32))
    return tf.bitcast(h, tf.int64)


def mix64(z: tf.Tensor) -> tf.Tensor:
    """splitmix64's output function on uint64."""
    z = z + _u(0x9E3779B97F4A7C15)
    z = _xor(z, _shr(z, 30)) * _u(0xBF58476D1CE4E5B9)
    z = _xor(z, _shr(z, 27)) * _u(0x94D049BB133111EB)
    return _xor(z, _shr(z, 31))


def initial_values(keys: tf.Tensor, base: int, dim: int, kind: str, param: float) -> tf.Tensor:
    """Initial float32 values ``[n, dim]`` of ``keys`` (int64) for a table whose hash base is
    ``base`` (:func:`embtrain.embedding.initializers.table_base`); ``kind``: zeros, constant,
    uniform, normal or truncated_normal; ``param``: value, scale or std."""
    n = tf.shape(keys)[0]
    if kind == "zeros":
        return tf.zeros([n, dim], tf.float32)
    if kind == "constant":
        return tf.fill([n, dim], tf.constant(param, tf.float32))
    rows = tf.bitcast(tf.cast(keys, tf.int64), tf.uint64)
    row_hash = mix64(_xor(_u(base) + tf.zeros_like(rows), mix64(rows)))[:, None]
    cols = _shl(tf.cast(tf.range(dim), tf.uint64), 8)[None, :]

    def bits(j: int | tf.Tensor) -> tf.Tensor:
        stream = tf.cast(j, tf.uint64)
        return mix64(_xor(row_hash, mix64(tf.bitwise.bitwise_or(cols, stream))))

    def unit(x: tf.Tensor) -> tf.Tensor:
        return tf.cast(_shr(x, 11), tf.float64) * 2.0**-53

    if kind == "uniform":
        return tf.cast(param * (2.0 * unit(bits(0)) - 1.0), tf.float32)

    def draw(attempt: tf.Tensor) -> tf.Tensor:
        u1 = (tf.cast(_shr(bits(2 * attempt), 11), tf.float64) + 1.0) * 2.0**-53
        u2 = unit(bits(2 * attempt + 1))
        return tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * 3.141592653589793 * u2)

    z = draw(tf.constant(0, tf.int64))
    if kind == "truncated_normal":
        def again(attempt: tf.Tensor, z: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            cand = draw(attempt)
            return attempt + 1, tf.where(tf.abs(z) > 2.0, cand, z)

        _, z = tf.while_loop(
            lambda a, z: tf.logical_and(a < 127, tf.reduce_any(tf.abs(z) > 2.0)), again,
            (tf.constant(1, tf.int64), z))
    return tf.cast(param * z, tf.float32)


def stored_values(x: tf.Tensor, dtype: str) -> tf.Tensor:
    """float32 ``x`` as a table of ``dtype`` holds it: a half type's nearest value (ties to
    even, TensorFlow's cast), widened back to float32; float32 as it is."""
    if dtype == "float32":
        return x
    half = {"bfloat16": tf.bfloat16, "float16": tf.float16}[dtype]
    return tf.cast(tf.cast(x, half), tf.float32)
