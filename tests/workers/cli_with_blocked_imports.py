"""``python -m embtrain ARGS`` in a process where the named modules cannot be imported (as if
they were not installed): tensorflow,horovod is what a GPU machine with JAX and no TensorFlow
has; horovod alone is what the quickstart's set-up (``bash scripts/bootstrap.sh``) installs.

    python tests/workers/cli_with_blocked_imports.py tensorflow,horovod run RECIPE --run-dir DIR
"""

from __future__ import annotations

import importlib.util
import sys

BLOCKED: tuple[str, ...] = ()


def _blocked(name: str) -> bool:
    return any(name == b or name.startswith(b + ".") for b in BLOCKED)


class _Blocker:
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if _blocked(name):
            raise ImportError(f"{name} is blocked in this process")


_find_spec = importlib.util.find_spec


def _no_spec(name: str, package: str | None = None) -> object:
    return None if _blocked(name) else _find_spec(name, package)


if __name__ == "__main__":
    BLOCKED = tuple(m for m in sys.argv[1].split(",") if m)
    sys.meta_path.insert(0, _Blocker())
    importlib.util.find_spec = _no_spec  # type: ignore[assignment]
    from embtrain.cli.main import main

    sys.exit(main(sys.argv[2:]))
