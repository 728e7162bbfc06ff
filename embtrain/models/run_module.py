"""A run directory's own copy of its Keras model's module.

``run`` copies the module ``model.build`` names (and every other module or package it imported
from ``model.path`` while the model was built: a sibling file, the rest of its package) into
``RUN/model/``, and the run's ``recipe.yaml`` names that copy (``model.path: model``, relative
to the run directory). ``predict``, ``export`` and ``run --resume`` import the module from there,
so editing or deleting the file the run started from changes nothing; a run directory whose
``recipe.yaml`` points its module outside itself (edited, received from someone, or made before
the copy existed) is refused unless the user allows it explicitly (``--allow-outside-module``).

Only Python modules are copied: a data file the module opens itself, or a module it imports
only when called later, is not. A builder found on the Python path rather than under
``model.path`` (an installed package) is part of the environment and is not copied; its content
hash is still recorded in every checkpoint and checked.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

from embtrain.errors import UserInputError
from embtrain.recipe.models import KerasModel, Recipe

#: The run directory's folder holding the module's copy (``model.path`` of its recipe.yaml).
MODULE_DIR = "model"
#: The option of predict, export and run --resume that imports a module from outside the run.
ALLOW_OPTION = "--allow-outside-module"


def _installed_roots() -> tuple[Path, ...]:
    """Where embtrain, installed packages and the standard library live: never copied (a
    ``model.path`` that holds them, e.g. a checkout of embtrain, copies only the user's
    modules)."""
    paths = sysconfig.get_paths()
    return tuple(Path(p).resolve() for p in (Path(__file__).resolve().parents[1],
                                             paths["purelib"], paths["platlib"],
                                             paths["stdlib"]))


def imported_from(directory: Path) -> list[Path]:
    """The top-level modules (``.py`` files) and packages (folders) under ``directory`` that
    this process has imported: the builder's module and whatever it imported from there."""
    directory = directory.resolve()
    skip = _installed_roots()
    found: set[Path] = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if any(path.is_relative_to(root) for root in skip):
            continue
        if not path.is_relative_to(directory):
            continue
        found.add(directory / path.relative_to(directory).parts[0])
    return sorted(found)


def copy_module(cfg: KerasModel, run_dir: Path) -> KerasModel:
    """Copy the builder's module (and its siblings and package, as imported) into
    ``run_dir/model``; ``cfg`` with ``path`` naming that copy, relative to ``run_dir``."""
    # Keras only here: run_recipe's check runs before the dense backend is chosen, and
    # importing keras_model (hence Keras) would fix it to TensorFlow
    from embtrain.models.keras_model import KerasModelError, load_builder

    load_builder(cfg.build, cfg.path)  # imported already when the model was built: cached
    if cfg.path is None:
        return cfg
    target = Path(run_dir) / MODULE_DIR
    target.mkdir(exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for source in imported_from(Path(cfg.path)):
        try:
            if source.is_dir():
                shutil.copytree(source, target / source.name, ignore=ignore, dirs_exist_ok=True)
            else:
                shutil.copy2(source, target / source.name)
        except OSError as exc:
            raise KerasModelError(f"model.build: {source}: cannot copy the module into "
                                  f"{target} ({exc.strerror or exc})") from None
    return cfg.model_copy(update={"path": MODULE_DIR})


def saved_recipe(recipe: Recipe, run_dir: Path) -> Recipe:
    """The recipe a new run saves in ``run_dir/recipe.yaml``: a Keras model's module copied
    into the run directory and named there by a relative path (other models: ``recipe``)."""
    if not isinstance(recipe.model, KerasModel):
        return recipe
    return recipe.model_copy(update={"model": copy_module(recipe.model, run_dir)})


def check_module_inside(run_dir: Path, recipe: Recipe, allow_outside: bool) -> None:
    """One line (exit 2) when the run directory's recipe imports its module from outside the
    run directory and the user did not pass ``--allow-outside-module``; nothing is imported."""
    if not isinstance(recipe.model, KerasModel) or recipe.model.path is None or allow_outside:
        return
    where = Path(recipe.model.path).resolve()
    root = Path(run_dir).resolve()
    if where.is_relative_to(root):
        return
    raise UserInputError(
        f"{Path(run_dir) / 'recipe.yaml'}: model.path: {recipe.model.path} is outside the run "
        f"directory, so the module there ({recipe.model.build}) is not the run's own copy "
        f"({MODULE_DIR}/ in the run directory): pass {ALLOW_OPTION} to import and run it from "
        "there if you trust it (runs made before embtrain copied the module need it)")
