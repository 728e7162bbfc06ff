"""What this CPU is: its model name and the vector instructions that decide embtrain's speed.

The machines embtrain runs on differ (an Intel Xeon with AVX-512, AVX512-BF16 and AMX one day,
an AMD EPYC with AVX2 only the next), and half precision depends on it most: TensorFlow's
bfloat16 matmuls are native on the first and emulated on the second. ``bench`` and ``plan``
print :func:`cpu_summary`; ``validate`` and ``plan`` say what to expect of mixed precision
where the CPU has no native half arithmetic (:func:`half_precision_note`). Read from
``/proc/cpuinfo`` (Linux); elsewhere the model is :func:`platform.processor` and no flags.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import cache
from pathlib import Path

#: the vector ISA, widest first: (name shown, cpuinfo flags that must all be present)
VECTOR_ISAS = (
    ("AVX-512", ("avx512f",)),
    ("AVX2", ("avx2", "fma")),
    ("AVX", ("avx",)),
    ("SSE4.2", ("sse4_2",)),
)
#: half-precision arithmetic the CPU has: (name shown, cpuinfo flag)
HALF_FEATURES = (
    ("AMX-BF16", "amx_bf16"),
    ("AVX512-BF16", "avx512_bf16"),
    ("AVX512-FP16", "avx512_fp16"),
)


@dataclass(frozen=True)
class Cpu:
    """The CPU's model name and its cpuinfo flags."""

    model: str
    flags: frozenset[str]

    @property
    def vector_isa(self) -> str:
        """The widest vector instruction set (``AVX-512``, ``AVX2``, ...), ``unknown`` if none."""
        for name, needed in VECTOR_ISAS:
            if all(flag in self.flags for flag in needed):
                return name
        return "unknown"

    @property
    def half_features(self) -> list[str]:
        """Native bfloat16 / float16 arithmetic (``AMX-BF16``, ``AVX512-BF16``, ...)."""
        return [name for name, flag in HALF_FEATURES if flag in self.flags]

    @property
    def native_bfloat16(self) -> bool:
        return "amx_bf16" in self.flags or "avx512_bf16" in self.flags

    def summary(self) -> str:
        """``model, ISA (+ half features)`` in one phrase, e.g. ``AMD EPYC 7B13, AVX2, no native
        bfloat16``."""
        half = " + ".join(self.half_features) if self.half_features else "no native bfloat16"
        return f"{self.model}, {self.vector_isa}, {half}"


def parse_cpuinfo(text: str) -> Cpu:
    """The first processor's model name and flags from ``/proc/cpuinfo``'s text."""
    model, flags = "", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        if model and flags:
            break
    return Cpu(model or platform.processor() or "unknown CPU", flags)


@cache
def this_cpu() -> Cpu:
    """This machine's CPU (read once)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return Cpu(platform.processor() or "unknown CPU", frozenset())


def cpu_summary() -> str:
    """:meth:`Cpu.summary` of this machine's CPU."""
    return this_cpu().summary()


#: DE tiny's dense step, bfloat16 widened to float32 ÷ float32, CPU time, where TensorFlow has
#: no oneDNN bfloat16 kernel (docs/PERFORMANCE.md, "Mixed precision by CPU")
BF16_SLOWDOWN_WITHOUT_NATIVE = "about 1.4x as long as in float32 (measured on DE tiny's MLP)"


def half_precision_note(mixed_precision: str, cpu: Cpu | None = None) -> str | None:
    """One line on what ``train.mixed_precision`` will do on ``cpu`` (this one by default):
    ``None`` for float32 or where the CPU computes bfloat16 natively."""
    cpu = cpu or this_cpu()
    if mixed_precision == "none" or cpu.native_bfloat16:
        return None
    name = {"bf16": "bfloat16", "fp16": "float16"}.get(mixed_precision, mixed_precision)
    return (f"train.mixed_precision: {mixed_precision}: this CPU ({cpu.model}, {cpu.vector_isa}) "
            f"has no native bfloat16 or float16 arithmetic, so the dense network's {name} "
            f"matmuls are emulated through float32 (same results as a native CPU) and run "
            f"{BF16_SLOWDOWN_WITHOUT_NATIVE}; mixed_precision pays off on CPUs with AMX or "
            "AVX512-BF16 and on GPUs")
