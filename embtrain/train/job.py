"""The training job of `embtrain run`: all side effects live here.

One step: the reader yields a batch; the engine looks up and pools the
embeddings (one ``[batch, width]`` array per fused group); TensorFlow runs the
dense model forward and backward and returns the gradient with respect to those
arrays; the engine reduces it per unique row and applies the fused sparse
optimizer update (DESIGN.md decision 1).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.comm import Communicator
from embtrain.errors import EmbtrainError, UserInputError
from embtrain.recipe import Recipe, recipe_fingerprint, recipe_to_yaml
from embtrain.recipe.kinds import in_files
from embtrain.train.counters import DynamicCounters
from embtrain.train.finished import finished_summary
from embtrain.train.loss_window import LossWindow
from embtrain.train.pipeline import StepPipeline
from embtrain.train.rundir_lock import lock_run_dir
from embtrain.train.signals import GracefulStop
from embtrain.train.summary import EvalResult, RunSummary, defined_auc, eval_headline
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
        from embtrain.train.rundir import occupied_hint

        raise UserInputError(f"{run_dir}: run directory exists and is not empty; "
                             f"{occupied_hint(run_dir)}")
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
    """Deterministic Keras: fixed seeds (Python, NumPy, Keras, TensorFlow's where imported)
    and, on the TensorFlow backend, deterministic ops. On JAX (its ops are deterministic on
    the CPU; see docs/DESIGN_NOTES.md for the GPU) TensorFlow is not imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from embtrain.models.backend import current_backend, select_backend

    if (current_backend() or select_backend("auto")) == "tensorflow":
        import tensorflow as tf

        tf.keras.utils.set_random_seed(seed)
        tf.config.experimental.enable_op_determinism()
        return
    import keras

    keras.utils.set_random_seed(seed)


STEP_PURPOSES = ("ids", "ids.ahead", "forward", "backward", "dense", "control")


def step_traffic(comm: Communicator) -> int:
    """Bytes this rank sent to other ranks for training steps (not evaluation or checkpoints)."""
    return sum(comm.traffic.sent.get(p, 0) for p in STEP_PURPOSES)


class _NoProgress:
    """The progress display of ranks other than 0: silent."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, step: int, loss: float, detail: str | None = None) -> float:
        return 0.0

    def note(self, text: str) -> None:
        return None


class PlanMismatchError(EmbtrainError):
    """The ranks of one job computed different plans."""


class TrainJob:
    """Builds the sharded embedding, reader and dense model from a recipe and trains.

    With ``comm`` of several ranks, every rank runs its own ``TrainJob`` on its slice of each
    global batch; rank 0 alone writes the run directory, logs and checkpoints.
    """

    def __init__(self, recipe: Recipe, source: str, options: RunOptions = RunOptions(),
                 comm: Communicator | None = None):
        from embtrain.comm import LocalComm

        if options.seed is not None:
            recipe = recipe.model_copy(
                update={"train": recipe.train.model_copy(update={"seed": options.seed})}
            )
        self.comm: Communicator = comm or LocalComm()
        check_supported(recipe, source, self.comm.size)
        from embtrain.train.device import resolve_device

        # where this rank trains: `train.device: gpu` without one stops here (one line)
        self.device = resolve_device(recipe, source, self.comm.size)
        from embtrain.models.backend import select_backend

        # the dense network's Keras backend, chosen before anything imports Keras (one line
        # when it cannot be had, or the recipe asks what it does not do)
        self.dense_backend = select_backend(recipe.train.dense_backend, source, recipe)
        self.recipe = recipe
        self.source = source
        self.options = options
        self.seed = recipe.train.seed
        self.is_root = self.comm.rank == 0
        self._counters = DynamicCounters()  # dynamic tables' totals across resumes

    def _agreed_topology(self) -> Any:
        """The topology every rank plans with: measured on rank 0, broadcast to the others."""
        from embtrain.plan import Topology

        text = None
        if self.is_root:
            text = json.dumps(Topology.detect(self.comm.size).to_dict())
        text = self.comm.broadcast_bytes(text.encode() if text else None).decode()
        top = json.loads(text)
        if not self.device.on_gpu or self.device.simulated:  # the device tier in host memory
            top["device_memory"] = None
        return Topology(**top)

    def check_plans_agree(self, when: str) -> None:
        """All ranks hold the same plan fingerprint; one line naming the ranks otherwise."""
        from embtrain.comm.base import agree

        if self.comm.size == 1:
            return
        prints = agree(self.comm, self.plan.fingerprint)
        odd = [r for r, f in enumerate(prints) if f != prints[0]]
        if odd:
            raise PlanMismatchError(
                f"{self.source}: at {when}, rank(s) {odd} planned differently from rank 0 "
                f"(fingerprints {prints[odd[0]][:12]} vs {prints[0][:12]}); run every rank "
                "with the same recipe and embtrain version"
            )

    # ------------------------------------------------------------------ building
    def _build(self) -> None:
        from embtrain.data import BatchReader
        from embtrain.data.check import check_eval_split
        from embtrain.data.fingerprint import data_fingerprint
        from embtrain.plan import make_plan
        from embtrain.train.builder import build_trainer
        from embtrain.train.device import bind

        recipe = self.recipe
        bind(self.device)  # this rank's GPU (or none) for CuPy, numba.cuda and TensorFlow
        self.plan = make_plan(recipe, self._agreed_topology())
        self.check_plans_agree("start")
        if any(in_files(t.tier) for table in recipe.tables for t in table.storage[1:]):
            from embtrain.storage.checks import check_disk_tiers

            # each rank its own shards' files: missing, unwritable or too small is one line
            check_disk_tiers(recipe, self.plan, self.source, ranks=[self.comm.rank])
        if recipe.data.batch_size < self.comm.size:
            raise UserInputError(
                f"{self.source}: data.batch_size {recipe.data.batch_size} is smaller than the "
                f"{self.comm.size} processes; every rank needs at least one row per batch"
            )
        configure_tensorflow(self.seed)
        from embtrain.models.keras_model import KerasModelError

        try:
            self.trainer = build_trainer(recipe, self.plan, self.comm, seed=self.seed,
                                         device=self.device)
        except KerasModelError as exc:  # the user's model: one line naming the recipe
            raise UserInputError(f"{self.source}: {exc}") from None
        self.engine = self.trainer.embedding
        self.model = self.trainer.model
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
                self.recipe, "train", rank=self.comm.rank, world_size=self.comm.size,
                epoch=epoch, start_batch=start_batch, seed=self.seed
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
        """Save a checkpoint after ``step`` completed steps (the next batch is at ``step``).

        With several ranks rank 0 writes while every rank serves the collectives of the
        export (a tiered table in chunks, never whole; the others gathered whole), in table
        order; whatever rank 0's write did, every rank runs them all, then rank 0 broadcasts
        the outcome so that every rank stops on a failed write.
        """
        from embtrain.checkpoint.collective import CollectiveExport
        from embtrain.train.dense_state import average_network_state

        average_network_state(self.model, self.comm)  # every rank then holds the same state
        # a diverged state is never written: the last good checkpoint stays
        self._guard.before_checkpoint(self.model, self.engine, step)
        extra = {
            # collective with several ranks: every rank checkpoints at the same steps
            "dynamic_counters": self._counters.state(self.engine.dynamic_metrics()),
            "samples": samples,
            "losses": losses[-self.recipe.train.log_every :],
            "label_losses": self._report.state(),
            "evals": [asdict(e) for e in evals],
            "data": self.data_fingerprint,
        }
        position = divmod(step, self.batches_per_epoch)
        if self.comm.size == 1:
            checkpoints.save(step, self.engine, self.model, position, extra, seed=self.seed)
            return
        export = CollectiveExport(self.engine)
        error = ""
        try:
            if self.is_root:
                checkpoints.save(step, export, self.model, position, extra, seed=self.seed)
        except (OSError, EmbtrainError) as exc:
            error = f"checkpoint at step {step} failed on rank 0: {exc}"
        finally:
            export.drain()
        error = self.comm.broadcast_bytes(error.encode() if self.is_root else None).decode()
        if error:
            raise EmbtrainError(error)

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, step: int) -> EvalResult | None:
        """Exact AUC and logloss over the eval split (or its first ``eval_max_batches``)."""
        from embtrain.metrics import auc, logloss

        if self.recipe.data.eval is None:
            return None
        from embtrain.train.dense_state import average_network_state

        average_network_state(self.model, self.comm)  # every rank evaluates the same network
        labels, scores = [], []
        reader = self._reader_cls(self.recipe, "eval", rank=self.comm.rank,
                                  world_size=self.comm.size, seed=self.seed)
        for i, batch in enumerate(reader):
            if self.recipe.train.eval_max_batches and i >= self.recipe.train.eval_max_batches:
                break
            scores.append(self.trainer.predict(batch))
            labels.append(batch.label)
        if not labels:
            return None
        y = np.concatenate(labels).astype(np.float32)
        p = np.concatenate(scores).astype(np.float32)
        if self.comm.size > 1:  # every row of the split on every rank (AUC is exact)
            from embtrain.comm.wire import Cursor, pack

            tail = y.shape[1:]
            got, _ = self.comm.allgatherv(pack([np.array([y.size], np.int64), y.reshape(-1),
                                                p.reshape(-1)]), "eval")
            cur = Cursor(got)
            ys, ps = [], []
            for _ in range(self.comm.size):
                n = int(cur.take(np.int64, 1)[0])
                ys.append(cur.take(np.float32, n))
                ps.append(cur.take(np.float32, n))
            y = np.concatenate(ys).reshape(-1, *tail)
            p = np.concatenate(ps).reshape(-1, *tail)
        per: dict[str, dict[str, float]] | None = None
        if self.recipe.data.labels is not None:
            from embtrain.metrics import label_metrics

            specs = self.recipe.data.label_specs()
            per = label_metrics([(lab.name, lab.loss) for lab in specs], y, p)
            first = next((j for j, lab in enumerate(specs) if lab.loss == "bce"), None)
            reported = per[specs[first].name] if first is not None else {}
            value = float(reported.get("auc", float("nan")))
            loss = float(reported.get("logloss", float("nan")))
            if first is None:  # regression labels only: no AUC or logloss, each label's MSE
                return EvalResult(step=step, auc=None, logloss=float("nan"),
                                  rows=int(y.shape[0]), labels=per)
            y = y[:, first]
        else:
            value, loss = float(auc(y, p)), float(logloss(y, p))
        value, note = defined_auc(value, y)
        return EvalResult(step=step, auc=value, logloss=loss, rows=int(y.shape[0]),
                          auc_note=note, labels=per)

    def _evaluate_or_save(
        self, checkpoints: Any, step: int, samples: int, losses: Any, evals: list[EvalResult]
    ) -> EvalResult | None:
        """:meth:`evaluate`; when it fails, the trained state is checkpointed before the error
        (one process: with several, the other ranks are still in the evaluation's collectives,
        so the failing rank stops the job and the last checkpoint is kept)."""
        try:
            return self.evaluate(step)
        except Exception:
            if step > 0 and self.comm.size == 1:
                self._checkpoint(checkpoints, step, samples, losses, evals)
            raise

    # ---------------------------------------------------------------------- run
    def _prepare_run_dir(self) -> tuple[Path, RunSummary | None]:
        """Rank 0 creates (or takes, with --resume) the run directory and locks it; every rank
        learns it. A finished run (``--resume`` without ``--from-step``) comes back as its
        stored summary, on every rank, and nothing is changed."""
        self._lock = None
        message = ""
        if self.is_root:
            done = None
            if self.options.resume is not None:
                run_dir = Path(self.options.resume)
                self._lock = lock_run_dir(run_dir)  # before anything there is read or written
                if self.options.from_step is None:
                    done = finished_summary(run_dir, self.total_steps)
                if done is not None:
                    self._lock.release()
            else:
                run_dir = make_run_dir(self.recipe, self.options.run_dir)
                self._lock = lock_run_dir(run_dir)
                from embtrain.models.run_module import saved_recipe

                # a Keras model's module is copied in: the run imports its own copy later
                saved = saved_recipe(self.recipe, run_dir)
                (run_dir / "recipe.yaml").write_text(recipe_to_yaml(saved))
                (run_dir / "plan.json").write_text(self.plan.to_json())
            message = json.dumps({"path": str(run_dir), "finished": done is not None})
        if self.comm.size > 1:
            message = self.comm.broadcast_bytes(message.encode() if self.is_root else None).decode()
        agreed = json.loads(message)
        run_dir = Path(agreed["path"])
        self.run_dir = run_dir
        if not agreed["finished"]:
            return run_dir, None
        if self.is_root:
            return run_dir, done
        return run_dir, finished_summary(run_dir, self.total_steps)

    def _restore(self, checkpoints: Any) -> Any:
        """Load the checkpoint rank 0 chose into every rank (each reads its own shards)."""
        from embtrain.checkpoint.manager import find_checkpoint

        if self.comm.size == 1:
            return checkpoints.restore(self.engine, self.model, step=self.options.from_step)
        chosen = ""
        if self.is_root:
            chosen = str(find_checkpoint(checkpoints.run_dir, self.options.from_step))
        chosen = self.comm.broadcast_bytes(chosen.encode() if self.is_root else None).decode()
        state = checkpoints.restore(self.engine, self.model, Path(chosen),
                                    supersede_newer=self.is_root)
        self.comm.barrier()
        return state

    def run(self, stop: GracefulStop | None = None) -> RunSummary:
        """Train to the end, evaluating and logging on the recipe's cadence.

        Once ``stop.requested`` (a SIGTERM/SIGINT), the run ends after the current step with a
        checkpoint and ``stopped="signal"``.
        """
        from embtrain.checkpoint import CheckpointManager
        from embtrain.train.divergence import LOSS_LIMIT, DivergenceGuard
        from embtrain.train.metrics_log import MetricsLog
        from embtrain.train.progress import StepProgress, announce
        from embtrain.train.resume_data import check_resume_data
        from embtrain.train.step_report import StepReport, describe

        stop = stop or GracefulStop()  # not entered: no handlers, never requested
        self._build()
        recipe = self.recipe
        run_dir, done = self._prepare_run_dir()
        if done is not None:
            return done
        self.run_dir = run_dir
        if self.is_root and self.device.reason:  # what train.device: auto decided, and why
            announce(self.device.reason,
                     sys.stderr if self.options.progress_to_stderr else sys.stdout)
        checkpoints = CheckpointManager.for_recipe(run_dir, recipe)
        all_bce = all(lab.loss == "bce" for lab in self.recipe.data.label_specs())
        self._guard = DivergenceGuard(checkpoints, self.source, self.comm,
                                      LOSS_LIMIT if all_bce else math.inf)
        step, samples, epoch, start_batch = 0, 0, 0, 0
        losses = self._losses = LossWindow(recipe.train.log_every)  # not every step's loss
        evals: list[EvalResult] = []
        self._report = StepReport(recipe, self.trainer.model)
        if self.options.resume is not None:
            if self.is_root:
                check_resume_data(run_dir, self.options.from_step, self.data_fingerprint,
                                  "data" in self.options.allow)
            self.comm.barrier()
            state = self._restore(checkpoints)
            step, samples = state.step, int(state.extra["samples"])
            epoch, start_batch = state.epoch, state.batch
            self._counters.restore(state.extra.get("dynamic_counters", {}),
                                   self.engine.dynamic_metrics())
            losses.extend(float(x) for x in state.extra["losses"])
            self._report = StepReport(recipe, self.trainer.model,
                                      state.extra.get("label_losses", []))
            evals = [EvalResult(**e) for e in state.extra["evals"]]
            if self.is_root:
                trim_metrics(run_dir, step)
        if self.is_root:  # once the run (or its resume) is accepted: what --resume starts again
            from embtrain.train.rundir import record_processes

            record_processes(run_dir, self.comm.size)
        first_samples = samples  # throughput counts the samples of this part only
        log = MetricsLog(run_dir, tensorboard=self.options.tensorboard) if self.is_root else None
        if log is not None and self.options.resume is not None:
            log.write({"kind": "resume", "step": step, "checkpoint": str(state.path)})
        elif log is not None:
            log.write(
                {
                    "kind": "start",
                    "step": 0,
                    "recipe": recipe.name,
                    "fingerprint": recipe_fingerprint(recipe),
                    "plan_fingerprint": self.plan.fingerprint,
                    "processes": self.comm.size,
                    "transport": self.comm.transport,
                    "total_steps": self.total_steps,
                    "batches_per_epoch": self.batches_per_epoch,
                    "seed": self.seed,
                }
            )
        batch_size = recipe.data.batch_size
        eval_every = recipe.train.eval_every
        loss = float("nan")
        self.comm.traffic.reset()
        start = time.perf_counter()
        first_step = step
        progress_display = (
            StepProgress(
                self.total_steps,
                batch_size,
                recipe.train.log_every,
                interactive=self.options.interactive,
                to_stderr=self.options.progress_to_stderr,
            )
            if self.is_root
            else _NoProgress()
        )
        with progress_display as progress:
            # each step with the next batch on its way (embtrain.train.pipeline)
            steps = StepPipeline(self.trainer, self._train_batches(epoch, start_batch),
                                 self.total_steps)
            stopping = stop.requested and self.comm.size == 1
            while step < self.total_steps and not stopping:
                # every rank votes with its own signal flag; all stop after the same step
                done = steps.step(step, vote=stop.requested)
                if done is None:
                    break
                batch, loss = done
                stopping = self.trainer.voted
                step += 1
                samples += batch.global_rows
                losses.append(loss)
                self._guard.after_step(loss, step)  # before any checkpoint of it
                self._report.after_step(self.trainer.label_losses)
                logging = step % recipe.train.log_every == 0 or step == self.total_steps
                shown = self._report.fields(step) if logging and log is not None else None
                rate = progress.update(step, losses, describe(shown) if shown else None)
                # collective with several ranks: every rank asks at the same steps
                dynamic = (self._counters.adjust(self.trainer.embedding.dynamic_metrics())
                           if logging else {})
                tiers = self.trainer.embedding.tier_metrics() if logging else {}
                if log is not None and logging:
                    window = losses[-recipe.train.log_every :]
                    record: dict[str, Any] = {
                        "kind": "train",
                        "step": step,
                        "loss": float(np.mean(window)),
                        "samples_per_s": rate,
                        **(shown or {}),
                    }
                    if dynamic:
                        record["dynamic_tables"] = dynamic
                    if tiers:
                        record["tiers"] = tiers
                    if self.comm.size > 1:
                        record["comm_bytes_per_step"] = step_traffic(self.comm) / max(
                            1, step - first_step
                        )
                    log.write(record)
                if eval_every and step % eval_every == 0 and step < self.total_steps:
                    result = self._evaluate_or_save(checkpoints, step, samples, losses, evals)
                    if result is not None:
                        evals.append(result)
                        if log is not None:
                            log.write(result.record())
                        progress.note(f"eval @ step {step}: {eval_headline(result)}")
                if checkpoints.due(step, self.total_steps) and step < self.total_steps:
                    self._checkpoint(checkpoints, step, samples, losses, evals)
        seconds = time.perf_counter() - start
        stopped = "signal" if stopping else None
        in_loop = checkpoints.due(step, self.total_steps) and step < self.total_steps  # saved
        if recipe.train.eval_at_end and not stopped:
            result = self._evaluate_or_save(checkpoints, step, samples, losses, evals)
            if result is not None:
                evals.append(result)
                if log is not None:
                    log.write(result.record())
        # The last checkpoint comes after the final evaluation, so a resumed run reports it too.
        if step > 0 and (
            (stopped and not in_loop)
            or (not stopped and (checkpoints.at_end or checkpoints.due(step, self.total_steps)))
        ):
            self._checkpoint(checkpoints, step, samples, losses, evals)
        self._guard.finish()
        self.check_plans_agree("stop")
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
            processes=self.comm.size,
            transport=self.comm.transport,
            stopped=stopped,
        )
        if log is not None:
            log.write(
                {"kind": "end", "step": step, "final_loss": summary.final_loss,
                 "seconds": seconds, "stopped": stopped}
            )
            log.close()
            (run_dir / "summary.json").write_text(
                json.dumps(summary.to_dict(), indent=2, sort_keys=True)
            )
        if self._lock is not None:
            self._lock.release()
        return summary
