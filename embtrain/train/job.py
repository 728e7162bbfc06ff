"""The training job of `embtrain run`: all side effects live here.

One step: the reader yields a batch; the engine looks up and pools the
embeddings (one ``[batch, width]`` array per fused group); TensorFlow runs the
dense model forward and backward and returns the gradient with respect to those
arrays; the engine reduces it per unique row and applies the fused sparse
optimizer update (DESIGN.md decision 1).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.errors import TrainingDiverged, UserInputError
from embtrain.recipe import Recipe, recipe_fingerprint, recipe_to_yaml
from embtrain.train.finished import finished_summary
from embtrain.train.loss_window import LossWindow
from embtrain.train.rundir_lock import lock_run_dir
from embtrain.train.support import check_supported


@dataclass(frozen=True)
class RunOptions:
    """Command-line overrides of a run."""

    run_dir: Path | None = None
    max_steps: int | None = None
    seed: int | None = None
    interactive: bool | None = None
    tensorboard: bool = True
    progress_to_stderr: bool = False  # keep stdout for machine output (--json)
    resume: Path | None = None  # continue this run directory from a checkpoint
    from_step: int | None = None  # ... the one at this step (default: the latest)
    init_from: Path | None = None  # warm start from an export (embtrain load)
    allow: frozenset[str] = frozenset()  # differences from the export to accept


@dataclass
class EvalResult:
    """Exact metrics over an evaluation split."""

    step: int
    auc: float
    logloss: float
    rows: int


@dataclass
class RunSummary:
    """What a finished run reports."""

    run_dir: str
    steps: int
    epochs: float
    seconds: float
    samples_per_s: float
    final_loss: float
    evals: list[EvalResult] = field(default_factory=list)
    best_auc: float | None = None

    @property
    def last_eval(self) -> EvalResult | None:
        return self.evals[-1] if self.evals else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_run_dir(recipe: Recipe, run_dir: Path | None) -> Path:
    """``runs/<recipe name>/<UTC timestamp>`` unless given; never reuses a non-empty directory."""
    if run_dir is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        base = Path("runs") / str(recipe.name) / stamp
        run_dir, n = base, 1
        while run_dir.exists():
            n += 1
            run_dir = base.with_name(f"{stamp}-{n}")
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise UserInputError(
            f"{run_dir}: run directory exists and is not empty; choose another --run-dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def trim_metrics(run_dir: Path, step: int) -> None:
    """Drop the records an interrupted run wrote after the checkpoint it resumes from."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("kind") != "end" and int(record.get("step", 0)) <= step:
                keep.append(line + "\n")
    tmp = path.with_name("metrics.jsonl.tmp")
    tmp.write_text("".join(keep))
    os.replace(tmp, path)


def dataset_best_auc(recipe: Recipe) -> float | None:
    """The generator's best achievable AUC, when the data came from `embtrain gen-data`."""
    pattern = recipe.data.train if isinstance(recipe.data.train, str) else recipe.data.train[0]
    directory = Path(pattern).parent
    for candidate in (directory / "dataset.json", directory.parent / "dataset.json"):
        if candidate.is_file():
            try:
                value = json.loads(candidate.read_text()).get("best_auc")
            except (OSError, ValueError):
                return None
            return float(value) if value is not None else None
    return None


def configure_tensorflow(seed: int) -> None:
    """Deterministic TensorFlow: fixed seeds, deterministic ops."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


class TrainJob:
    """Builds the engine, reader and dense model from a recipe and trains."""

    def __init__(self, recipe: Recipe, source: str, options: RunOptions = RunOptions()):
        if options.seed is not None:
            recipe = recipe.model_copy(
                update={"train": recipe.train.model_copy(update={"seed": options.seed})}
            )
        check_supported(recipe, source)
        self.recipe = recipe
        self.source = source
        self.options = options
        self.seed = recipe.train.seed

    # ------------------------------------------------------------------ building
    def _build(self) -> None:
        from embtrain.data import BatchReader
        from embtrain.data.check import check_eval_split
        from embtrain.data.fingerprint import data_fingerprint
        from embtrain.embedding import EmbeddingEngine
        from embtrain.models import build_model
        from embtrain.plan import Topology, make_plan
        from embtrain.train.convert import (
            feature_configs,
            feature_slots,
            sparse_optimizer_config,
            table_configs,
        )

        recipe = self.recipe
        self.plan = make_plan(recipe, Topology.detect(1))
        configure_tensorflow(self.seed)
        self.engine = EmbeddingEngine(
            table_configs(recipe),
            feature_configs(recipe),
            sparse_optimizer_config(recipe.optimizer.sparse),
            seed=self.seed,
        )
        slots = feature_slots(recipe, self.engine.layout)
        num_dense = sum(len(f.columns) for f in recipe.dense_features)
        self.model = build_model(recipe.model, num_dense=num_dense, slots=slots, seed=self.seed)
        self.model.make_optimizer(recipe.optimizer.dense)
        self._outputs: dict[int, list[np.ndarray]] = {}
        self._reader_cls = BatchReader
        probe = BatchReader(recipe, "train")
        self.batches_per_epoch = probe.batches_per_epoch()
        check_eval_split(recipe)  # every eval file's footer and schema, before step 1
        self.data_fingerprint = data_fingerprint(recipe)  # recorded in checkpoints
        if self.batches_per_epoch <= 0:
            raise UserInputError(
                f"{self.source}: data.train: fewer rows than one batch "
                f"({recipe.data.batch_size}); lower data.batch_size"
            )
        if recipe.train.steps is not None:
            total = recipe.train.steps
        else:
            total = max(1, round(float(recipe.train.epochs or 1) * self.batches_per_epoch))
        if self.options.max_steps is not None:
            total = min(total, self.options.max_steps)
        self.total_steps = total
        if self.options.init_from is not None:
            from embtrain.checkpoint import warm_start

            self.warm_start = warm_start(
                self.engine, self.model, self.options.init_from, recipe, set(self.options.allow)
            )

    def _train_batches(self, epoch: int = 0, start_batch: int = 0) -> Iterator[Any]:
        while True:
            reader = self._reader_cls(
                self.recipe, "train", epoch=epoch, start_batch=start_batch, seed=self.seed
            )
            empty = True
            for batch in reader:
                empty = False
                yield batch
            if empty:
                return
            epoch, start_batch = epoch + 1, 0

    def _checkpoint(
        self,
        checkpoints: Any,
        step: int,
        samples: int,
        losses: list[float],
        evals: list[EvalResult],
    ) -> None:
        """Save a checkpoint after ``step`` completed steps (the next batch is at ``step``)."""
        checkpoints.save(
            step,
            self.engine,
            self.model,
            divmod(step, self.batches_per_epoch),
            {
                "samples": samples,
                "losses": losses[-self.recipe.train.log_every :],
                "evals": [asdict(e) for e in evals],
                "data": self.data_fingerprint,
            },
            seed=self.seed,
        )

    def _forward(self, batch: Any) -> list[np.ndarray]:
        """Engine forward into output buffers reused across steps of the same batch size.

        Fresh multi-megabyte arrays each step cost page faults; the buffers are 64-byte
        aligned so TensorFlow reads them through DLPack without a copy.
        """
        outs = self._outputs.get(batch.size)
        if outs is None:
            if len(self._outputs) > 4:
                self._outputs.clear()
            outs = self._outputs[batch.size] = self.engine.new_outputs(batch.size)
        return self.engine.forward(batch.sparse, out=outs)

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, step: int) -> EvalResult | None:
        """Exact AUC and logloss over the eval split (or its first ``eval_max_batches``)."""
        from embtrain.models.metrics import auc, logloss

        if self.recipe.data.eval is None:
            return None
        labels, scores = [], []
        reader = self._reader_cls(self.recipe, "eval", seed=self.seed)
        for i, batch in enumerate(reader):
            if self.recipe.train.eval_max_batches and i >= self.recipe.train.eval_max_batches:
                break
            groups = self._forward(batch)
            scores.append(self.model.predict(batch.dense, groups))
            labels.append(batch.label)
        if not labels:
            return None
        y, p = np.concatenate(labels), np.concatenate(scores)
        return EvalResult(
            step=step, auc=float(auc(y, p)), logloss=float(logloss(y, p)), rows=int(y.shape[0])
        )

    def _evaluate_or_save(
        self, checkpoints: Any, step: int, samples: int, losses: Any, evals: list[EvalResult]
    ) -> EvalResult | None:
        """:meth:`evaluate`; when it fails, the trained state is checkpointed before the error."""
        try:
            return self.evaluate(step)
        except Exception:
            if step > 0:
                self._checkpoint(checkpoints, step, samples, losses, evals)
            raise

    # ---------------------------------------------------------------------- run
    def run(self) -> RunSummary:
        """Train to the end, evaluating and logging on the recipe's cadence."""
        from embtrain.checkpoint import CheckpointManager
        from embtrain.data.fingerprint import check_resume_data
        from embtrain.train.metrics_log import MetricsLog
        from embtrain.train.progress import StepProgress

        self._build()
        recipe = self.recipe
        if self.options.resume is not None:
            run_dir = Path(self.options.resume)
            self._lock = lock_run_dir(run_dir)  # before anything there is read or written
            done = None if self.options.from_step is not None else finished_summary(
                run_dir, self.total_steps)
            if done is not None:
                self._lock.release()
                return done
        else:
            run_dir = make_run_dir(recipe, self.options.run_dir)
            self._lock = lock_run_dir(run_dir)
            (run_dir / "recipe.yaml").write_text(recipe_to_yaml(recipe))
            (run_dir / "plan.json").write_text(self.plan.to_json())
        self.run_dir = run_dir
        checkpoints = CheckpointManager.for_recipe(run_dir, recipe)
        step, samples, epoch, start_batch = 0, 0, 0, 0
        losses = self._losses = LossWindow(recipe.train.log_every)  # not every step's loss
        evals: list[EvalResult] = []
        if self.options.resume is not None:
            check_resume_data(run_dir, self.options.from_step, self.data_fingerprint,
                              "data" in self.options.allow)
            state = checkpoints.restore(self.engine, self.model, step=self.options.from_step)
            step, samples = state.step, int(state.extra["samples"])
            epoch, start_batch = state.epoch, state.batch
            losses.extend(float(x) for x in state.extra["losses"])
            evals = [EvalResult(**e) for e in state.extra["evals"]]
            trim_metrics(run_dir, step)
        first_samples = samples  # throughput counts the samples of this part only
        log = MetricsLog(run_dir, tensorboard=self.options.tensorboard)
        if self.options.resume is not None:
            log.write({"kind": "resume", "step": step, "checkpoint": str(state.path)})
        else:
            log.write(
                {
                    "kind": "start",
                    "step": 0,
                    "recipe": recipe.name,
                    "fingerprint": recipe_fingerprint(recipe),
                    "total_steps": self.total_steps,
                    "batches_per_epoch": self.batches_per_epoch,
                    "seed": self.seed,
                }
            )
        batch_size = recipe.data.batch_size
        eval_every = recipe.train.eval_every
        loss = float("nan")
        start = time.perf_counter()
        with StepProgress(
            self.total_steps,
            batch_size,
            recipe.train.log_every,
            interactive=self.options.interactive,
            to_stderr=self.options.progress_to_stderr,
        ) as progress:
            batches = self._train_batches(epoch, start_batch)
            while step < self.total_steps:
                batch = next(batches, None)
                if batch is None:
                    break
                groups = self._forward(batch)
                loss, grads = self.model.train_step(batch.dense, groups, batch.label)
                self.engine.backward_update(grads, step)
                step += 1
                samples += batch.size
                losses.append(loss)
                if not np.isfinite(loss):
                    raise TrainingDiverged(
                        f"{self.source}: training diverged: the loss became {loss} at step "
                        f"{step}; lower the learning rates (optimizer.sparse.lr, optimizer.dense.lr)"
                    )
                rate = progress.update(step, loss)
                if step % recipe.train.log_every == 0 or step == self.total_steps:
                    window = losses[-recipe.train.log_every :]
                    log.write(
                        {
                            "kind": "train",
                            "step": step,
                            "loss": float(np.mean(window)),
                            "samples_per_s": rate,
                        }
                    )
                if eval_every and step % eval_every == 0 and step < self.total_steps:
                    result = self._evaluate_or_save(checkpoints, step, samples, losses, evals)
                    if result is not None:
                        evals.append(result)
                        log.write({"kind": "eval", **asdict(result)})
                        progress.note(
                            f"eval @ step {step}: auc {result.auc:.4f}  logloss {result.logloss:.4f}"
                        )
                if checkpoints.due(step, self.total_steps) and step < self.total_steps:
                    self._checkpoint(checkpoints, step, samples, losses, evals)
        seconds = time.perf_counter() - start
        if recipe.train.eval_at_end:
            result = self._evaluate_or_save(checkpoints, step, samples, losses, evals)
            if result is not None:
                evals.append(result)
                log.write({"kind": "eval", **asdict(result)})
        # The last checkpoint comes after the final evaluation, so a resumed run reports it too.
        if step > 0 and (checkpoints.at_end or checkpoints.due(step, self.total_steps)):
            self._checkpoint(checkpoints, step, samples, losses, evals)
        summary = RunSummary(
            run_dir=str(run_dir),
            steps=step,
            epochs=step / self.batches_per_epoch,
            seconds=seconds,
            samples_per_s=(samples - first_samples) / max(seconds, 1e-9),
            final_loss=float(np.mean(losses[-recipe.train.log_every :]))
            if losses
            else float("nan"),
            evals=evals,
            best_auc=dataset_best_auc(recipe),
        )
        log.write(
            {"kind": "end", "step": step, "final_loss": summary.final_loss, "seconds": seconds}
        )
        log.close()
        (run_dir / "summary.json").write_text(
            json.dumps(summary.to_dict(), indent=2, sort_keys=True)
        )
        self._lock.release()
        return summary
