"""Which Keras backend runs the dense network: the recipe's ``train.dense_backend``.

``tensorflow`` (the default where TensorFlow imports: Horovod, SavedModel export, mixed
precision) or ``jax`` (a stateless, jitted step: :mod:`embtrain.models.dense_jax`; what runs
on GPU machines that have JAX but no TensorFlow). ``auto``: TensorFlow when it imports, else
JAX.

Keras 3 fixes its backend once per process, when ``keras`` is first imported (from the
``KERAS_BACKEND`` environment variable). So the job chooses it before anything imports Keras:
:func:`select_backend` sets ``KERAS_BACKEND`` in this process's environment from the recipe,
whatever the user's shell holds; the user never sets it. A process in which Keras is already
imported with another backend (a notebook that imported Keras first) is told so in one line:
``keras.config.set_backend`` would reload Keras' modules under objects that still hold the
old ones. Commands that need TensorFlow itself (``export``'s SavedModel, ``predict``) select
``tensorflow`` whatever the recipe says: checkpoints are backend-neutral NumPy arrays.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from embtrain.errors import UserInputError

DENSE_BACKENDS = ("auto", "tensorflow", "jax")


def tensorflow_imports() -> bool:
    """Whether ``import tensorflow`` works in this process."""
    if "tensorflow" in sys.modules:
        return True
    if importlib.util.find_spec("tensorflow") is None:
        return False
    try:
        import tensorflow  # noqa: F401
    except Exception:
        return False
    return True


def resolve_backend(wanted: str) -> str:
    """``tensorflow`` or ``jax`` for a recipe's ``train.dense_backend``."""
    if wanted not in DENSE_BACKENDS:
        raise ValueError(f"dense_backend must be one of {DENSE_BACKENDS}, got {wanted!r}")
    if wanted == "auto":
        return "tensorflow" if tensorflow_imports() else "jax"
    return wanted


def backend_label(wanted: str) -> str:
    """The library a recipe's ``train.dense_backend`` runs on, for messages, found without
    importing it (``auto``: TensorFlow where it is installed, as :func:`resolve_backend`
    would choose when it imports)."""
    if wanted == "auto":
        wanted = "tensorflow" if importlib.util.find_spec("tensorflow") is not None else "jax"
    return {"tensorflow": "TensorFlow", "jax": "JAX"}[wanted]


_selected: str | None = None  # what select_backend chose before Keras was imported


def current_backend() -> str | None:
    """The Keras backend of this process: Keras' own once imported, else the one
    :func:`select_backend` chose; ``None`` when neither."""
    keras = sys.modules.get("keras")
    if keras is None or not hasattr(keras, "backend"):
        return _selected
    return str(keras.backend.backend())


def recipe_problems(recipe: Any, backend: str) -> list[str]:
    """What ``recipe`` asks that the dense ``backend`` does not do (one line each)."""
    out = []
    if backend == "jax" and recipe.train.mixed_precision != "none":
        out.append(f"train.mixed_precision: {recipe.train.mixed_precision} runs on the "
                   "TensorFlow dense backend only; set train.dense_backend: tensorflow or "
                   "train.mixed_precision: none")
    return out


def select_backend(wanted: str, source: str = "recipe", recipe: Any = None) -> str:
    """Make ``wanted`` (a ``train.dense_backend`` value) this process's Keras backend and
    return it (``tensorflow`` or ``jax``); one line (:class:`UserInputError`) when it cannot
    be had or ``recipe`` asks what it does not do."""
    name = resolve_backend(wanted)
    if name == "jax" and importlib.util.find_spec("jax") is None:
        raise UserInputError(f"{source}: train.dense_backend: jax, but JAX is not installed "
                             "(pip install jax)")
    if name == "tensorflow" and not tensorflow_imports():
        raise UserInputError(f"{source}: train.dense_backend: tensorflow, but TensorFlow "
                             "cannot be imported here; use train.dense_backend: jax or auto")
    if recipe is not None:
        problems = recipe_problems(recipe, name)
        if problems:
            raise UserInputError(f"{source}: {problems[0]}")
    global _selected
    current = current_backend()
    if current is None:
        os.environ["KERAS_BACKEND"] = name
        _selected = name
        if name == "jax":  # share the GPU with CuPy's pool: JAX takes memory as it needs it
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        return name
    if current != name:
        raise UserInputError(f"{source}: train.dense_backend: {name}, but Keras was already "
                             f"imported in this process with the {current} backend; start a "
                             "new process (embtrain picks the backend before importing Keras)")
    return name
