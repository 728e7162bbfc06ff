"""Your own Keras model as the dense network (``model: {type: keras, build: "pkg.mod:fn"}``).

embtrain imports ``pkg.mod`` (from ``model.path``, by default the recipe's directory, then the
Python path) and calls ``fn(inputs, options)``:

- ``inputs.features``: one :class:`FeatureInput` per categorical feature (``name``, ``width``
  of its pooled vector, ``kind`` ``"categorical"``), in recipe order;
- ``inputs.dense_width``: the number of dense columns (the ``inputs.dense_name`` input);
- ``inputs.dense_name``: ``"embtrain_dense"``, a name no Keras layer takes by default (a model
  built before it existed may still call that input ``"dense"``, as long as no layer of the
  model is also called ``dense``);
- ``inputs.labels``: the label names (``data.labels``, else ``[data.label]``);
- ``options``: the recipe's ``model.options`` mapping.

It returns a ``keras.Model`` whose inputs are named by feature name, plus ``inputs.dense_name``
when ``dense_width > 0``, each ``[batch, width]`` float32, and whose output is one logit per
label: a dict keyed by label name, or a single tensor when there is one label (``[batch]`` or
``[batch, 1]``). embtrain keeps the embeddings, the sparse optimizer, the data, checkpoints
(the model's weights, its non-trainable state and the dense optimizer's state), several ranks
(dense gradients all-reduced). The weights are created from Keras' global seed, which embtrain
sets from ``train.seed`` before building, so every rank builds the same model.

Non-trainable state (``model.non_trainable_variables``: batch-norm moving statistics, a dropout
layer's seed state) is checkpointed after the weights, restored on resume and exported. The
training step calls the model with ``training=True`` (batch statistics, moving averages
updated, dropout on), evaluation and predict with ``training=False``. With several ranks each
rank normalizes its slice of the batch with that slice's statistics and updates its own moving
averages; they are averaged over the ranks before every checkpoint and evaluation
(:func:`embtrain.train.dense_state.average_network_state`), which for moving averages equals
averaging after every step (the update is linear and training never reads them).

With ``train.mixed_precision: bf16 | fp16`` the builder runs while Keras' global dtype policy
is ``mixed_bfloat16`` / ``mixed_float16``: Keras layers created without an explicit ``dtype``
then compute in the half type and keep float32 weights, which is what the model must do
(every trainable weight float32, else one line and exit 2). Its inputs still arrive as
float32 (Keras layers cast them), and its logits are cast to float32 before the loss, so an
output layer in the half type is fine (Keras' guide suggests ``dtype="float32"`` on the last
layer; embtrain does not require it). Custom layers must follow ``self.compute_dtype``.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras

from embtrain.errors import UserInputError
from embtrain.models.ops import ops
from embtrain.models.precision import FLOAT32, Precision, keras_policy
from embtrain.models.slots import FeatureSlot
from embtrain.recipe.models import KerasModel

#: The name of the dense input: no Keras layer takes it by default (an unnamed first ``Dense``
#: layer is called ``dense``).
DENSE_INPUT = "embtrain_dense"
#: What the dense input was called before: still accepted.
OLD_DENSE_INPUT = "dense"


class KerasModelError(UserInputError):
    """The user's model builder cannot be imported, fails, or returns the wrong thing."""


@dataclass(frozen=True)
class FeatureInput:
    """One embedding input of the model."""

    name: str
    width: int
    kind: str = "categorical"


@dataclass(frozen=True)
class ModelInputs:
    """What the builder function is told about its inputs and outputs."""

    features: tuple[FeatureInput, ...]
    dense_width: int
    labels: tuple[str, ...]
    dense_name: str = DENSE_INPUT


def load_builder(spec: str, path: str | None) -> Any:
    """The function ``spec`` (``module:function``), its module looked up in ``path`` first.

    This imports, so runs, the user's module (``validate``, ``run``, ``predict``, ``export``
    and ``--resume`` all do)."""
    module_name, _, func_name = spec.partition(":")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name != module_name and not module_name.startswith(exc.name + "."):
            # the module was found; something it imports was not
            raise KerasModelError(f"model.build: {_user_frame(exc) or module_name}: the module "
                                  f"imports '{exc.name}', which is not installed ({exc.msg}); "
                                  "install it in this Python environment") from None
        where = f"{path} and the Python path" if path else "the Python path"
        raise KerasModelError(f"model.build: cannot import module '{module_name}' ({exc.msg}; "
                              f"searched {where})") from None
    except BaseException as exc:  # the user's module failed (or exited) while importing
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise KerasModelError(f"model.build: importing '{module_name}' raised "
                              f"{_raised(exc)}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise KerasModelError(f"model.build: module '{module_name}' ({module.__file__}) has no "
                              f"function '{func_name}'")
    return func


def _user_frame(exc: BaseException) -> str | None:
    """``file:line`` of the innermost frame of ``exc`` in the user's code (outside embtrain,
    the installed packages and the standard library), or ``None``."""
    import sysconfig

    skip = tuple(str(Path(p).resolve()) for p in (
        Path(__file__).resolve().parents[1], sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"], sysconfig.get_paths()["stdlib"]))
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.startswith("<") or \
                str(Path(frame.filename).resolve()).startswith(skip):
            continue
        found = f"{frame.filename}:{frame.lineno}"
    return found


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _raised(exc: BaseException) -> str:
    """What the user's code raised, with where: ``Type: message (at file:line)``; a
    ``SystemExit`` says the builder exited."""
    at = _user_frame(exc)
    where = f" (at {at})" if at else ""
    if isinstance(exc, SystemExit):
        return (f"SystemExit({exc.code!r}){where}: the module exited the process; a builder "
                "must return a keras.Model (raise an exception to refuse)")
    return f"{type(exc).__name__}: {_first_line(exc)}{where}"


def module_identity(cfg: KerasModel) -> dict[str, str]:
    """The builder's source file and its content hash, recorded in every checkpoint: the
    module's content belongs to the run's identity, like the recipe and the data (only the
    file that defines the builder is hashed, not what it imports)."""
    func = load_builder(cfg.build, cfg.path)
    module = sys.modules.get(getattr(func, "__module__", "") or "")
    file = getattr(module, "__file__", None)
    if not file:
        return {"build": cfg.build}
    try:
        digest = hashlib.sha256(Path(file).read_bytes()).hexdigest()[:16]
    except OSError as exc:
        raise KerasModelError(f"model.build: {file}: cannot read the module "
                              f"({exc.strerror})") from None
    return {"build": cfg.build, "file": str(file), "sha256": digest}


def check_module_identity(then: Any, cfg: KerasModel, where: str) -> None:
    """Refuse (one line, exit 2) when the builder's module changed since checkpoint ``where``
    was written (``then``: its recorded :func:`module_identity`; ``None`` for checkpoints of
    older versions, not checked)."""
    if not isinstance(then, dict) or "sha256" not in then:
        return
    now = module_identity(cfg)
    if now.get("sha256") == then["sha256"]:
        return
    file = now.get("file") or then.get("file")
    raise KerasModelError(
        f"{file}: the model module changed since {where} was written (sha256 {then['sha256']} "
        f"then, {now.get('sha256', 'unknown')} now), so its weights would run in another "
        "network: restore the module as it was when the run trained, or train "
        "a new run with the edited module")


def build_keras(cfg: KerasModel, slots: Sequence[FeatureSlot], num_dense: int,
                labels: Sequence[str]) -> keras.Model:
    """Import and call the builder, then check the model on a dummy batch of two rows."""
    func = load_builder(cfg.build, cfg.path)
    inputs = ModelInputs(tuple(FeatureInput(s.name, s.width) for s in slots), int(num_dense),
                         tuple(labels))
    try:
        model = func(inputs, dict(cfg.options))
    except (Exception, SystemExit) as exc:
        raise KerasModelError(f"model.build: {cfg.build}(inputs, options) raised "
                              f"{_raised(exc)}") from None
    if not isinstance(model, keras.Model):
        raise KerasModelError(f"model.build: {cfg.build} returned {type(model).__name__}, "
                              "not a keras.Model")
    names = [getattr(t, "name", None) for t in (model.inputs or [])]
    dense = dense_input_name(names)
    want = [s.name for s in slots] + ([dense] if num_dense else [])
    missing = [n for n in want if n not in names]
    extra = [n for n in names if n not in want and not (n == dense and not num_dense)]
    if missing or extra:
        raise KerasModelError(
            f"model.build: the model's inputs are {names}; expected one per feature plus "
            f"'{dense}': {want}" + (f" (missing {missing})" if missing else "")
            + (f" (unknown {extra})" if extra else ""))
    if not model.trainable_weights:
        raise KerasModelError("model.build: the model has no trainable weights")
    # two batch sizes: a model whose output shape is fixed to one batch (a reshape to a
    # constant shape, a reduction over rows) passes one and fails the other, here, in one line
    for rows in (2, 3):
        feed = {n: ops.zeros([rows, _width(n, slots, num_dense)]) for n in names}
        try:
            out = model(feed)
            logits(out, labels, rows)
        except KerasModelError as exc:
            if rows == 2:
                raise
            raise KerasModelError(f"{exc} on a batch of 3 rows (it worked on 2): the output "
                                  "must follow the batch size") from None
        except Exception as exc:
            more = "" if rows == 2 else " (it worked on 2: the output depends on the batch size)"
            raise KerasModelError(f"model.build: calling the model on a batch of {rows} rows "
                                  f"raised {_raised(exc)}{more}") from None
    return model


def dense_input_name(names: Sequence[str | None]) -> str:
    """The model's dense input: :data:`DENSE_INPUT`, or the older :data:`OLD_DENSE_INPUT`
    where the model has that input and not the new one."""
    return OLD_DENSE_INPUT if OLD_DENSE_INPUT in names and DENSE_INPUT not in names \
        else DENSE_INPUT


def _width(name: str, slots: Sequence[FeatureSlot], num_dense: int) -> int:
    for s in slots:
        if s.name == name:
            return s.width
    return num_dense


def logits(out: Any, labels: Sequence[str], batch: int | None = None) -> Any:
    """The model's output as ``[b]`` (one label) or ``[b, labels]``; wrong shapes are one line."""
    if isinstance(out, dict):
        keys = list(out)
        if sorted(keys) != sorted(labels):
            raise KerasModelError(f"model.build: the model's outputs are {keys}; expected one "
                                  f"logit per label: {list(labels)}")
        cols = [_column(out[name], name, batch) for name in labels]
    elif len(labels) == 1 and hasattr(out, "shape"):
        cols = [_column(out, labels[0], batch)]
    else:
        raise KerasModelError(f"model.build: the model returns {type(out).__name__}; with "
                              f"{len(labels)} labels it must return a dict of one logit per "
                              f"label: {list(labels)}")
    return cols[0] if len(cols) == 1 else ops.stack(cols, axis=1)


def _column(t: Any, name: str, batch: int | None) -> Any:
    shape = list(t.shape)
    ok = (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)) and (
        batch is None or shape[0] in (None, batch))
    if not ok:
        raise KerasModelError(f"model.build: output '{name}' has shape {shape}; expected "
                              "[batch] or [batch, 1] (one logit per row)")
    t = ops.cast(t, "float32")
    return t if len(shape) == 1 else t[:, 0]


class KerasNet:
    """A user's Keras model behind the :class:`~embtrain.models.networks.Network` interface."""

    def __init__(self, cfg: KerasModel, num_dense: int, slots: Sequence[FeatureSlot],
                 labels: Sequence[str], precision: Precision = FLOAT32):
        self.slots = list(slots)
        self.num_dense = int(num_dense)
        self.labels = list(labels)
        with keras_policy(precision):  # the user's layers take the mixed policy when built
            self.model = build_keras(cfg, self.slots, self.num_dense, self.labels)
        self._check_float32_weights()
        self.names = [getattr(t, "name", None) for t in self.model.inputs]
        self.dense_name = dense_input_name(self.names)

    def _check_float32_weights(self) -> None:
        for w in self.model.trainable_weights:
            if str(getattr(w.dtype, "name", w.dtype)) != "float32":
                raise KerasModelError(
                    f"model.build: weight {w.path} is {w.dtype}; the weights must be float32 "
                    "(with train.mixed_precision the layers compute in the half type and keep "
                    "float32 weights: do not give a layer dtype='bfloat16'/'float16', use "
                    "the default policy or a mixed_* one)")

    @property
    def variables(self) -> list[Any]:
        return list(self.model.trainable_weights)

    @property
    def state_variables(self) -> list[Any]:
        """What the model updates itself: batch-norm moving statistics, seed states."""
        return list(self.model.non_trainable_variables)

    @property
    def weight_names(self) -> list[str]:
        """The weights' paths (``dense/kernel``), in :attr:`variables` order."""
        return [str(w.path) for w in self.model.trainable_weights]

    def __call__(self, dense: Any, groups: Sequence[Any], training: bool = False) -> Any:
        feed: dict[str, Any] = {}
        for s in self.slots:
            g = groups[s.group]
            feed[s.name] = g if (s.start == 0 and int(g.shape[1] or -1) == s.width) \
                else g[:, s.start:s.end]
        if self.dense_name in self.names:
            feed[self.dense_name] = dense
        return logits(self.model(feed, training=training), self.labels)


def dummy_slots(features: Sequence[tuple[str, int]]) -> list[FeatureSlot]:
    """Slots for (name, width) pairs, one after the other in one group (for ``validate``)."""
    out, start = [], 0
    for name, width in features:
        out.append(FeatureSlot(name, 0, start, width, width))
        start += width
    return out


def check_recipe_model(cfg: KerasModel, features: Sequence[tuple[str, int]], num_dense: int,
                       labels: Sequence[str]) -> None:
    """Build the recipe's Keras model on a dummy batch (``validate``); errors as one line."""
    keras.utils.set_random_seed(0)
    build_keras(cfg, dummy_slots(features), num_dense, labels)
