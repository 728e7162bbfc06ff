"""Where numba caches embtrain's compiled kernels: one directory per content of their sources.

numba's own cache lives next to the source file (``__pycache__``) or under ``NUMBA_CACHE_DIR``
in a directory named after the source's absolute path, so a second checkout of the same
commit compiles every kernel again (minutes on two cores). Here the kernels of
:data:`KERNEL_SOURCES` are cached in ``<root>/numba/<key>``, where ``key`` hashes the content
of all those files (a kernel inlines functions from the others), numba's and Python's
versions; ``root`` is ``$EMBTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/embtrain``, else
``~/.cache/embtrain``. Any checkout of the same kernel code finds the same compiled code, and
a changed kernel can never load stale code. ``scripts/bootstrap.sh`` fills the cache
(:mod:`embtrain.cli.warm`).

:func:`install` must run before the kernel modules are imported (they call it first).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import numba
from numba.core import caching

ENV = "EMBTRAIN_CACHE_DIR"
#: The embtrain package directory.
PACKAGE = Path(__file__).resolve().parents[1]
#: The files whose njit functions are cached here, and the files those inline, relative to
#: the package.
#: Every module of :mod:`embtrain.kernels.rules` (and the optimizer spec its tables come from)
#: is inlined into the kernels, so all of them are part of the key.
KERNEL_SOURCES = (
    "kernels/cpu_bags.py", "kernels/cpu_fill.py", "kernels/cpu_pool.py", "kernels/cpu_update.py",
    "kernels/_llvm.py", "kernels/codes.py", "data/kernels.py",
    "kernels/dynamic.py", "comm/halves.py", "kernels/optimizer_spec.py", "kernels/halves.py",
    "kernels/typed_lists.py",
    *sorted(f"kernels/rules/{p.name}" for p in (PACKAGE / "kernels" / "rules").glob("*.py")),
)


def cache_root() -> Path:
    """``$EMBTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/embtrain``, else ``~/.cache/embtrain``."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "embtrain"


@functools.cache
def source_key(package: Path = PACKAGE) -> str:
    """A hash of the kernel sources' content (under ``package``) and numba's and Python's
    versions: equal for every checkout of the same kernel code."""
    h = hashlib.sha256(f"numba {numba.__version__} python {sys.version}".encode())
    for rel in KERNEL_SOURCES:
        h.update(rel.encode() + b"\0" + (package / rel).read_bytes() + b"\0")
    return h.hexdigest()[:20]


def cache_dir() -> Path:
    """The directory holding this kernel code's compiled functions."""
    return cache_root() / "numba" / source_key()


def _is_kernel_source(py_file: str) -> bool:
    try:
        rel = Path(py_file).resolve().relative_to(PACKAGE)
    except (OSError, ValueError):
        return False
    return rel.as_posix() in KERNEL_SOURCES


class KernelCacheLocator(caching._CacheLocator):
    """numba cache locator for embtrain's kernel files: :func:`cache_dir`, keyed by content."""

    def __init__(self, py_func: Any, py_file: str):
        self._lineno = py_func.__code__.co_firstlineno
        self._py_file = py_file  # numba names it when it warns that a function cannot be cached
        self._cache_path = str(cache_dir())

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> str:
        return source_key()

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> KernelCacheLocator | None:
        """A locator for a function of :data:`KERNEL_SOURCES`; ``None`` for any other
        function, or when the directory cannot be written (numba's own locators then apply)."""
        if not _is_kernel_source(py_file):
            return None
        self = cls(py_func, py_file)
        try:
            self.ensure_cache_path()
        except OSError:
            return None
        return self


def install() -> None:
    """Put :class:`KernelCacheLocator` first among numba's cache locators (idempotent)."""
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    if KernelCacheLocator not in impl._locator_classes:
        impl._locator_classes.insert(0, KernelCacheLocator)
