"""``python -m embtrain ARGS`` in a process where TensorFlow and Horovod cannot be imported
(what a GPU machine with JAX and no TensorFlow has):

    python tests/no_tensorflow_cli.py run RECIPE --run-dir DIR
"""

from __future__ import annotations

import importlib.util
import sys

BLOCKED = ("tensorflow", "horovod")


def _blocked(name: str) -> bool:
    return any(name == b or name.startswith(b + ".") for b in BLOCKED)


class _Blocker:
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if _blocked(name):
            raise ImportError(f"{name} is blocked in this process")


sys.meta_path.insert(0, _Blocker())
_find_spec = importlib.util.find_spec


def _no_spec(name: str, package: str | None = None) -> object:
    return None if _blocked(name) else _find_spec(name, package)


importlib.util.find_spec = _no_spec  # type: ignore[assignment]

if __name__ == "__main__":
    from embtrain.cli.main import main

    sys.exit(main(sys.argv[1:]))
