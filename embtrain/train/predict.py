"""``embtrain predict``: score Parquet rows with a run's checkpoint.

The rows go through what evaluation uses: the run's recipe with ``data.eval`` pointed at the
input, :class:`~embtrain.data.BatchReader` over the ``eval`` split (no shuffle, every row once,
files in sorted order), the sharded embedding restored from the checkpoint (dynamic tables
apply their ``missing:`` rule, tiered tables read through their tiers) and the dense network.
Rank ``r`` of ``w`` scores its slice of every global batch, as in evaluation; rank 0 gathers
the slices, puts them back in input order and writes one Parquet file (a temporary file
renamed into place), with ``probability`` and ``logit`` (float32) after the ``--keep`` columns.
Input without the recipe's label column is scored too (the reader then reads no label).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.comm import Communicator
from embtrain.errors import EmbtrainError, UserInputError, os_error_line
from embtrain.recipe import Recipe
from embtrain.recipe.kinds import in_files
from embtrain.recipe.models import Data

OUTPUT_COLUMNS = ("probability", "logit")
OUTPUT_SUFFIXES = ("_probability", "_logit", "_prediction")  # per label with data.labels


@dataclass(frozen=True)
class PredictOptions:
    """What to score and where to write it."""

    run_dir: Path
    data: str  # glob of Parquet files
    out: Path
    checkpoint: int | None = None  # the checkpoint at this step (default: the latest)
    keep: tuple[str, ...] = ()  # input columns copied through
    progress: bool = True  # rank 0 reports progress on stderr
    allow_outside_module: bool = False  # import a Keras module from outside the run directory


@dataclass
class PredictSummary:
    """What `predict` reports; ``auc``/``logloss`` when every input file has the recipe's label
    column."""

    run_dir: str
    checkpoint: str
    step: int
    out: str
    rows: int
    seconds: float
    rows_per_s: float
    auc: float | None = None
    logloss: float | None = None
    #: with ``data.labels``: each label's metrics (AUC and logloss of a bce label, MSE of an
    #: mse label; an undefined AUC, one class, is None)
    labels: dict[str, dict[str, float | None]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.labels is None:
            out.pop("labels")
        return out


def run_recipe(run_dir: Path, allow_outside_module: bool = False) -> tuple[Recipe, Path]:
    """The run's own recipe (``RUN_DIR/recipe.yaml``); one line when ``run_dir`` is not a run,
    or when its Keras module lies outside it and ``allow_outside_module`` is not given
    (:func:`embtrain.models.run_module.check_module_inside`)."""
    from embtrain.models.run_module import check_module_inside
    from embtrain.recipe import load_recipe

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserInputError(f"{run_dir}: no such run directory")
    source = run_dir / "recipe.yaml"
    if not source.is_file():
        raise UserInputError(f"{run_dir}: not a run directory (no recipe.yaml)")
    recipe = load_recipe(source)
    check_module_inside(run_dir, recipe, allow_outside_module)
    return recipe, source


#: The disk tiers of a scored run are copied under ``OUT's directory/<TIER_PREFIX>-<pid>-…``.
TIER_PREFIX = ".embtrain-predict-tiers"


def scoring_recipe(recipe: Recipe, data: str, tier_dir: Path | None) -> Recipe:
    """``recipe`` reading ``data`` as its eval split; file tiers (disk) moved under ``tier_dir`` (so
    that scoring never touches the run's own tier files)."""
    update: dict[str, Any] = {"data": recipe.data.model_copy(update={"eval": data})}
    if tier_dir is not None:
        tables = []
        for table in recipe.tables:
            storage = [t.model_copy(update={"path": str(tier_dir)}) if in_files(t.tier) else t
                       for t in table.storage]
            tables.append(table.model_copy(update={"storage": storage}))
        update["tables"] = tables
    return recipe.model_copy(update=update)


def _has_file_tier(recipe: Recipe) -> bool:
    return any(in_files(t.tier) for table in recipe.tables for t in table.storage)


def check_keep(paths: list[str], keep: tuple[str, ...], label_columns: list[str],
               data: Data) -> bool:
    """Every ``--keep`` column is in every file (one line otherwise); whether every file has the
    label column. The files are read as the run's ``data`` reads them (Parquet, CSV or TSV)."""
    from embtrain.data.sources import column_names

    for name in keep:
        if name in OUTPUT_COLUMNS or name.endswith(OUTPUT_SUFFIXES):
            raise UserInputError(f"--keep: '{name}' is an output column of predict")
    labelled = True
    for path in paths:
        names = set(column_names(path, data))
        for name in keep:
            if name not in names:
                raise UserInputError(f"{path}: --keep column '{name}' is missing "
                                     f"(file has {len(names)} columns)")
        labelled = labelled and all(c in names for c in label_columns)
    return labelled


class _Progress:
    """A line on stderr at most every ``every`` seconds (rank 0)."""

    def __init__(self, total: int, enabled: bool, every: float = 2.0):
        self.total, self.enabled, self.every = total, enabled, every
        self.start = self.last = time.perf_counter()

    def update(self, rows: int) -> None:
        now = time.perf_counter()
        if not self.enabled or now - self.last < self.every:
            return
        self.last = now
        rate = rows / max(now - self.start, 1e-9)
        print(f"predict: {rows:,}/{self.total:,} rows ({100.0 * rows / max(self.total, 1):.1f} %)"
              f"  {rate:,.0f} rows/s", file=sys.stderr, flush=True)


def _logit_function(model: Any) -> Callable[[Any, list[Any]], tuple[Any, Any]]:
    """``(dense, groups) -> (logits, probabilities)``: the network evaluation runs, plus its
    logits (the probability is the same ``tf.sigmoid`` of the same logits)."""
    import tensorflow as tf

    from embtrain.models.heads import predictions

    def score(dense: tf.Tensor, groups: list[tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        logits = model.network(dense, list(groups))
        if model.labels is None:
            return logits, tf.sigmoid(logits)
        heads = model._heads(logits)  # [b, labels]: a probability per bce label, mse outputs
        return heads, predictions(model.labels, heads)

    signature = [tf.TensorSpec([None, model.num_dense], tf.float32),
                 [tf.TensorSpec([None, w], model.group_dtype) for w in model.group_widths]]
    return tf.function(score, input_signature=signature, reduce_retracing=True)


def _agreed_topology(comm: Communicator) -> Any:
    from embtrain.plan import Topology

    text = json.dumps(Topology.detect(comm.size).to_dict()) if comm.rank == 0 else None
    text = comm.broadcast_bytes(text.encode() if text else None).decode()
    return Topology(**json.loads(text))


def _gather(comm: Communicator, counts: list[int], logits: np.ndarray, probs: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray] | None:
    """Every rank's slices on rank 0, in input order (batch by batch, rank by rank)."""
    if comm.size == 1:
        return logits, probs
    from embtrain.comm.wire import Cursor, pack

    width = 1 if logits.ndim == 1 else logits.shape[1]  # one column per label
    message = pack([np.array([len(counts)], np.int64), np.asarray(counts, np.int64),
                    logits.astype(np.float32).ravel(), probs.astype(np.float32).ravel()])
    got, _ = comm.allgatherv(message, "eval")
    if comm.rank != 0:
        return None
    cur = Cursor(got)
    parts: list[list[tuple[np.ndarray, np.ndarray]]] = []
    for _ in range(comm.size):
        nb = int(cur.take(np.int64, 1)[0])
        c = cur.take(np.int64, nb)
        n = int(c.sum())
        lg = cur.take(np.float32, n * width).reshape(n, *logits.shape[1:])
        pr = cur.take(np.float32, n * width).reshape(n, *logits.shape[1:])
        bounds = np.concatenate(([0], np.cumsum(c)))
        parts.append([(lg[bounds[b]:bounds[b + 1]], pr[bounds[b]:bounds[b + 1]])
                      for b in range(nb)])
    batches = len(parts[0])
    order_l, order_p = [], []
    for b in range(batches):
        for r in range(comm.size):
            order_l.append(parts[r][b][0])
            order_p.append(parts[r][b][1])
    return np.concatenate(order_l), np.concatenate(order_p)


def output_columns(labels: list[tuple[str, str]] | None) -> list[tuple[str, str, int]]:
    """(column name, "probability" | "logit", label index) of predict's output: ``probability``
    and ``logit`` for one label; with ``data.labels`` ``<label>_probability`` and
    ``<label>_logit`` per bce label and ``<label>_prediction`` per mse label."""
    if labels is None:
        return [("probability", "probability", 0), ("logit", "logit", 0)]
    out: list[tuple[str, str, int]] = []
    for t, (name, loss) in enumerate(labels):
        if loss == "bce":
            out += [(f"{name}_probability", "probability", t), (f"{name}_logit", "logit", t)]
        else:
            out.append((f"{name}_prediction", "probability", t))
    return out


def write_predictions(out: Path, paths: list[str], keep: tuple[str, ...], logits: np.ndarray,
                      probs: np.ndarray, labels: list[tuple[str, str]] | None = None,
                      read_keep: Callable[[str], Any] | None = None) -> None:
    """One Parquet file: the ``keep`` columns of ``paths`` (in order; ``read_keep(path)`` reads
    them, default: from Parquet), then the output columns (:func:`output_columns`); written to a temporary file beside ``out`` and renamed into
    place."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    writer = None
    try:
        at = 0
        sources: list[tuple[pa.Table | None, int]] = []
        if keep:
            for path in paths:
                table = (pq.read_table(path, columns=list(keep)) if read_keep is None
                         else read_keep(path))
                sources.append((table, table.num_rows))
        else:
            sources.append((None, int(logits.shape[0])))
        for table, rows in sources:
            columns = {} if table is None else {k: table.column(k) for k in keep}
            for name, kind, t in output_columns(labels):
                values = probs if kind == "probability" else logits
                part = values[at:at + rows] if labels is None else values[at:at + rows, t]
                columns[name] = pa.array(part, pa.float32())
            at += rows
            piece = pa.table(columns)
            if writer is None:
                writer = pq.ParquetWriter(tmp, piece.schema)
            writer.write_table(piece)
        if at != logits.shape[0]:
            raise UserInputError(f"{paths[0]}: the input changed while it was scored "
                                 f"({at} rows now, {logits.shape[0]} scored)")
        writer.close()  # type: ignore[union-attr]
        writer = None
        os.replace(tmp, out)
    finally:
        if writer is not None:
            writer.close()
        tmp.unlink(missing_ok=True)


def predict(options: PredictOptions, comm: Communicator | None = None) -> PredictSummary:
    """Score ``options.data`` with the run's checkpoint; rank 0 writes ``options.out``.

    Collective with several ranks: every rank calls it with the same options.
    """
    from embtrain.checkpoint import CheckpointManager
    from embtrain.checkpoint.manager import find_checkpoint
    from embtrain.comm import LocalComm
    from embtrain.data import BatchReader
    from embtrain.data.columns import read_spec
    from embtrain.data.reader import list_files
    from embtrain.data.sources import column_types, read_columns
    from embtrain.metrics import auc, label_metrics, logloss
    from embtrain.models.model import to_tensor
    from embtrain.plan import make_plan
    from embtrain.train.builder import build_trainer
    from embtrain.train.job import configure_tensorflow
    from embtrain.train.support import check_supported

    comm = comm or LocalComm()
    run_dir = Path(options.run_dir)
    recipe, source = run_recipe(run_dir, options.allow_outside_module)
    chosen = find_checkpoint(run_dir, options.checkpoint)  # one line when there is none
    out = Path(options.out)
    if out.exists():
        raise UserInputError(f"{out}: already exists; remove it or choose another --out")
    if out.is_dir():
        raise UserInputError(f"{out}: is a directory")
    paths = list_files(options.data, "--data")
    # with the label column in every file its values are checked, and AUC and logloss reported
    specs = recipe.data.label_specs()
    labelled = check_keep(paths, tuple(options.keep), [lab.column for lab in specs],
                          recipe.data)
    label_outputs = ([(lab.name, lab.loss) for lab in specs] if recipe.data.labels is not None
                     else None)
    from embtrain.checkpoint.tmpdirs import make_owned_dir, remove_own

    # named by owner: one a killed predict left is removed by the next predict beside it
    tier_parent = out.parent if out.parent.is_dir() else Path(tempfile.gettempdir())
    tier_dir: Path | None = None
    try:
        if _has_file_tier(recipe):
            tier_dir = make_owned_dir(tier_parent, TIER_PREFIX)
        scoring = scoring_recipe(recipe, options.data, tier_dir)
        check_supported(scoring, str(source), comm.size)
        if scoring.data.batch_size < comm.size:
            raise UserInputError(f"{source}: data.batch_size {scoring.data.batch_size} is "
                                 f"smaller than the {comm.size} processes")
        plan = make_plan(scoring, _agreed_topology(comm))
        from embtrain.models.backend import select_backend

        select_backend("tensorflow", "embtrain predict")  # scores through tf.function
        configure_tensorflow(scoring.train.seed)
        from embtrain.train.device import scoring_device

        # a run trained on a GPU is scored on one where there is one, else on the CPU
        trainer = build_trainer(scoring, plan, comm, seed=scoring.train.seed,
                                device=scoring_device(scoring, comm.size))
        manager = CheckpointManager.for_recipe(run_dir, recipe)
        state = manager.restore(trainer.embedding, trainer.model, chosen, supersede_newer=False)
        comm.barrier()
        score = _logit_function(trainer.model)
        reader = BatchReader(scoring, "eval", rank=comm.rank, world_size=comm.size,
                             seed=scoring.train.seed, labels=labelled)
        progress = _Progress(reader.total_rows, options.progress and comm.rank == 0)
        counts: list[int] = []
        logits, probs, labels = [], [], []
        start = time.perf_counter()
        done = 0
        for batch in reader:
            groups = trainer.forward(batch, training=False)
            lg, pr = score(to_tensor(batch.dense),
                           [trainer.model.group_tensor(g)
                            for g in trainer.device.to_network(groups)])
            counts.append(int(batch.size))
            logits.append(np.asarray(lg))
            probs.append(np.asarray(pr))
            labels.append(np.asarray(batch.label, np.float32))
            done += int(batch.global_rows)
            progress.update(done)
        nothing = np.zeros((0,) if label_outputs is None else (0, len(specs)), np.float32)
        local_l = np.concatenate(logits) if logits else nothing
        local_p = np.concatenate(probs) if probs else nothing
        gathered = _gather(comm, counts, local_l, local_p)
        y = np.concatenate(labels) if labels else nothing
        gathered_y = _gather(comm, counts, y, y)
        seconds = time.perf_counter() - start
        summary = PredictSummary(str(run_dir), str(state.path), int(state.step), str(out),
                                 done, seconds, done / max(seconds, 1e-9))
        error, code = "", "2"
        if comm.rank == 0:
            assert gathered is not None and gathered_y is not None
            all_l, all_p = gathered
            try:
                write_predictions(out, paths, tuple(options.keep), all_l, all_p, label_outputs,
                                  partial(read_columns, data=recipe.data, columns=list(options.keep),
                                          types=column_types(read_spec(recipe), recipe.data)))
            except UserInputError as exc:
                error = str(exc)
            except OSError as exc:
                error, code = os_error_line(exc), "1"
            first = next((t for t, lab in enumerate(specs) if lab.loss == "bce"), None)
            if all_p.size and labelled and first is not None:  # the first bce label, as eval
                y_first = gathered_y[0] if label_outputs is None else gathered_y[0][:, first]
                p_first = all_p if label_outputs is None else all_p[:, first]
                a = auc(y_first, p_first)
                summary.auc = None if np.isnan(a) else float(a)
                summary.logloss = float(logloss(y_first, p_first))
            if all_p.size and labelled and label_outputs is not None:
                summary.labels = {
                    name: {k: (float(v) if np.isfinite(v) else None) for k, v in m.items()}
                    for name, m in label_metrics(label_outputs, gathered_y[0], all_p).items()}
        if comm.size > 1:
            text = f"{code}{error}" if comm.rank == 0 else None
            text = comm.broadcast_bytes(text.encode() if text is not None else None).decode()
            code, error = text[:1], text[1:]
        if error:
            raise (UserInputError(error) if code == "2" else EmbtrainError(error))
        return summary
    finally:
        if _has_file_tier(recipe):  # a SIGTERM may land inside make_owned_dir, after its mkdir
            remove_own(tier_parent, TIER_PREFIX)
