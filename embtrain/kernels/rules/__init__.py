"""Kernel rules written once: scalar functions compiled for every kernel target.

Each module holds plain Python functions registered with numba's
:func:`~numba.extending.register_jitable`: the CPU kernels (``numba.njit``,
:mod:`embtrain.kernels.cpu`, :mod:`embtrain.kernels.dynamic`) and the CUDA kernels
(``numba.cuda.jit``, :mod:`embtrain.kernels.cuda`) call the same functions, which numba compiles
for the caller's target (inlined into the caller); under numba's CUDA simulator they run as
Python. The backends keep only their loops and launches.

* :mod:`.hashing` — the 64-bit key mix (splitmix64's output function) and unit floats;
* :mod:`.init` — the counter-based initial value of (row hash, column);
* :mod:`.optimizers` — the sparse optimizers' per-element and per-row update rules;
* :mod:`.halves` — float32 ⇄ bfloat16/float16 (widen, round to nearest, stochastic rounding)
  and the counter-based random bits of stochastic rounding.

The NumPy oracle the tests compare against (:mod:`embtrain.embedding.reference`) is written
separately on purpose. Every file here is part of the compiled-kernel cache key
(:data:`embtrain.kernels.numba_cache.KERNEL_SOURCES`). This package imports no numba at
import time of ``__init__``; the spec of the optimizers (slots, hyper-parameters, without
numba) is :mod:`embtrain.kernels.optimizer_spec`.
"""
