"""The ``fbgemm`` baseline: FBGEMM's CPU table-batched embedding (and, on the same ids,
``torch.nn.EmbeddingBag`` + Adagrad), run as a child process with the FBGEMM environment's
Python::

    .venv-fbgemm/bin/python -P embtrain/bench/baseline_fbgemm.py SPEC.json
    .venv-fbgemm/bin/python -P embtrain/bench/baseline_fbgemm.py --check CASE.npz OUT.npz

``fbgemm-gpu-cpu`` 1.8.0 needs exactly ``torch`` 2.13.0 (the CPU wheel), so it lives in its own
environment: ``bash scripts/bootstrap.sh --fbgemm`` makes ``.venv-fbgemm``. This file imports
only the standard library, numpy and its siblings :mod:`measure` and :mod:`baseline_tfra`
(the spec's checks; neither needs more) at module level (torch and fbgemm_gpu inside the
functions that need them). The runner resolves the model into the spec (tables, inputs, MLP,
learning rate) and adds ``kernel``:

* ``fbgemm``: one ``SplitTableBatchedEmbeddingBagsCodegen`` on the CPU for every table (fp32,
  sum pooling, a shared table read by several inputs through ``feature_table_map``), its
  optimizer fused into the backward: ``EXACT_ADAGRAD`` (element-wise Adagrad, the optimizer of
  embtrain's bench: ``acc += g²; w -= lr·g / (sqrt(acc) + eps)``, accumulators started at
  0.1 as embtrain's). All inputs of a step are one call (indices concatenated input by input,
  offsets fixed by the hotness and made once).
* ``torch``: one ``torch.nn.EmbeddingBag(mode="sum", sparse=True)`` per table, called once
  per input reading it, and ``torch.optim.Adagrad`` (same lr, initial accumulator, eps) on the
  sparse gradients.

Both train the same MLP (``torch.nn.Linear`` layers, ReLU, a 1-unit output, binary
cross-entropy on the logits, Adagrad). Fair settings the runner gives the child's
environment: ``OMP_WAIT_POLICY=PASSIVE`` (OpenMP threads do not spin between parallel
regions) and glibc's allocator kept from returning memory (``MALLOC_MMAP_MAX_=0``,
``MALLOC_TRIM_THRESHOLD_`` large): the step's outputs and gradients, hundreds of MB at batch
65536, are then reused from one step to the next instead of being mapped and page-faulted
afresh, as a caching allocator (or jemalloc) would.

Measured as every baseline is (:func:`measure.measure_steps`): ``fused`` (the whole training step),
``timed`` (phases: embedding forward; the dense forward, backward and update; the embedding
backward and update) and ``embedding_only`` (forward, backward from the last dense gradients,
update: the embedding part the bench compares).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

KERNELS = ("fbgemm", "torch")
#: what one fused step of each kernel runs (the report's label for the whole step)
FUSED_RUNS = {
    "fbgemm": "one eager PyTorch step (FBGEMM's table-batched embedding, its Adagrad fused "
              "into the backward)",
    "torch": "one eager PyTorch step (torch.nn.EmbeddingBag, torch.optim.Adagrad)",
}
OPTIMIZERS = ("adagrad",)
INITIAL_ACCUMULATOR = 0.1  # embtrain's (and Keras') Adagrad
EPSILON = 1e-7


if __package__:
    from embtrain.bench import baseline_tfra, measure
else:  # started with -P by another environment's Python: this directory's modules by name
    sys.path.append(str(Path(__file__).resolve().parent))
    import baseline_tfra
    import measure

PHASES = measure.PHASES
INIT_SCALE = baseline_tfra.INIT_SCALE
SPEC_FIELDS = (*baseline_tfra.SPEC_FIELDS, "kernel")


def check_spec(spec: dict[str, Any]) -> None:
    """Raise ValueError with one line when the spec cannot be run."""
    missing = [f for f in SPEC_FIELDS if f not in spec]
    if missing:
        raise ValueError(f"spec: missing {', '.join(missing)}")
    if spec["kernel"] not in KERNELS:
        raise ValueError(f"spec: kernel {spec['kernel']!r} is not one of {', '.join(KERNELS)}")
    if spec["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"spec: optimizer {spec['optimizer']!r}: the fbgemm baseline runs "
                         f"{', '.join(OPTIMIZERS)} (element-wise, fused into FBGEMM's backward)")
    baseline_tfra.check_spec({**spec, "optimizer": "adagrad"})


# ------------------------------------------------------------------------- embeddings


class FbgemmTables:
    """Every table in one FBGEMM CPU table-batched embedding with fused exact Adagrad."""

    def __init__(self, tables: list[dict[str, Any]], inputs: list[dict[str, Any]],
                 learning_rate: float) -> None:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        index = {t["name"]: n for n, t in enumerate(tables)}
        self.module = SplitTableBatchedEmbeddingBagsCodegen(
            [(int(t["rows"]), int(t["dim"]), EmbeddingLocation.HOST, ComputeDevice.CPU)
             for t in tables],
            feature_table_map=[index[i["table"]] for i in inputs],
            optimizer=EmbOptimType.EXACT_ADAGRAD, learning_rate=float(learning_rate),
            eps=EPSILON, pooling_mode=PoolingMode.SUM)
        for state in self.module.split_optimizer_states():
            state[0].fill_(INITIAL_ACCUMULATOR)
        self.hotness = [int(i["hotness"]) for i in inputs]
        self._offsets: dict[int, Any] = {}

    def weights(self) -> list[Any]:
        """Each table's weights (views into FBGEMM's storage)."""
        return list(self.module.split_embedding_weights())

    def offsets(self, batch: int) -> Any:
        """Bag offsets of one step's concatenated indices (input-major), made once."""
        import torch

        if batch not in self._offsets:
            sizes = np.repeat(np.asarray(self.hotness, np.int64), batch)
            self._offsets[batch] = torch.from_numpy(
                np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
        return self._offsets[batch]

    def feed(self, ids: list[np.ndarray]) -> Any:
        """One step's ids (``[batch, hotness]`` per input) as FBGEMM's flat indices."""
        import torch

        return torch.from_numpy(np.concatenate([x.reshape(-1) for x in ids]))

    def forward(self, fed: Any, batch: int) -> Any:
        """Pooled rows of every input, ``[batch, sum of dims]``."""
        return self.module(fed, self.offsets(batch))

    def after_backward(self) -> None:
        """Nothing: the update ran inside the backward."""


class TorchTables:
    """One ``torch.nn.EmbeddingBag`` per table and sparse ``torch.optim.Adagrad``."""

    def __init__(self, tables: list[dict[str, Any]], inputs: list[dict[str, Any]],
                 learning_rate: float) -> None:
        import torch

        self.bags = {t["name"]: torch.nn.EmbeddingBag(int(t["rows"]), int(t["dim"]), mode="sum",
                                                      sparse=True) for t in tables}
        self.order = [t["name"] for t in tables]
        self.tables_of_inputs = [i["table"] for i in inputs]
        self.optimizer = torch.optim.Adagrad(
            [self.bags[n].weight for n in self.order], lr=float(learning_rate),
            initial_accumulator_value=INITIAL_ACCUMULATOR, eps=EPSILON)

    def weights(self) -> list[Any]:
        """Each table's weights."""
        return [self.bags[n].weight.data for n in self.order]

    def feed(self, ids: list[np.ndarray]) -> Any:
        """One step's ids as tensors (no copy)."""
        import torch

        return [torch.from_numpy(np.ascontiguousarray(x)) for x in ids]

    def forward(self, fed: Any, batch: int) -> Any:
        """Pooled rows of every input, ``[batch, sum of dims]``."""
        import torch

        return torch.cat([self.bags[t](x) for t, x in zip(self.tables_of_inputs, fed,
                                                         strict=True)], dim=1)

    def after_backward(self) -> None:
        """The sparse Adagrad step on the gradients the backward left."""
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def make_tables(kernel: str, tables: list[dict[str, Any]], inputs: list[dict[str, Any]],
                learning_rate: float) -> FbgemmTables | TorchTables:
    """The embedding side of ``kernel``."""
    cls = FbgemmTables if kernel == "fbgemm" else TorchTables
    return cls(tables, inputs, learning_rate)


# ------------------------------------------------------------------------------ model


class PeerModel:
    """Tables, MLP and optimizers, with the fused and the phased steps."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import torch

        self.torch = torch
        seed = int(spec["seed"])
        torch.manual_seed(seed)
        lr = float(spec["learning_rate"])
        self.tables = make_tables(spec["kernel"], spec["tables"], spec["inputs"], lr)
        with torch.no_grad():
            for w in self.tables.weights():
                w.uniform_(-INIT_SCALE, INIT_SCALE)
        width = sum(int(i["dim"]) for i in spec["inputs"]) + int(spec["numerical"])
        sizes = [*map(int, spec["mlp"]), 1]
        layers: list[Any] = []
        for fan_in, fan_out in zip([width, *sizes[:-1]], sizes, strict=True):
            layer = torch.nn.Linear(fan_in, fan_out)
            torch.nn.init.xavier_uniform_(layer.weight)  # Glorot uniform, as Keras' Dense
            torch.nn.init.zeros_(layer.bias)
            layers += [layer, torch.nn.ReLU()]
        self.mlp = torch.nn.Sequential(*layers[:-1])
        self.dense_opt = torch.optim.Adagrad(self.mlp.parameters(), lr=lr,
                                             initial_accumulator_value=INITIAL_ACCUMULATOR,
                                             eps=EPSILON)
        self.loss_fn = torch.nn.BCEWithLogitsLoss()

    def _dense(self, pooled: Any, dense: Any, labels: Any) -> Any:
        logits = self.mlp(self.torch.cat([pooled, dense], dim=1))[:, 0]
        return self.loss_fn(logits, labels)

    def step(self, fed: Any, dense: Any, labels: Any) -> float:
        """One whole training step."""
        batch = dense.shape[0]
        loss = self._dense(self.tables.forward(fed, batch), dense, labels)
        self.dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.dense_opt.step()
        self.tables.after_backward()
        return float(loss)

    def phased_step(self, fed: Any, dense: Any, labels: Any
                    ) -> tuple[float, dict[str, float], Any]:
        """One step in three timed phases: lookup, the dense part, embedding backward + update."""
        batch = dense.shape[0]
        t0 = time.perf_counter()
        pooled = self.tables.forward(fed, batch)
        t1 = time.perf_counter()
        cut = pooled.detach().requires_grad_()
        loss = self._dense(cut, dense, labels)
        self.dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.dense_opt.step()
        t2 = time.perf_counter()
        pooled.backward(cut.grad)
        self.tables.after_backward()
        t3 = time.perf_counter()
        return float(loss), {"embedding_forward": t1 - t0, "dense": t2 - t1,
                             "embedding_update": t3 - t2, "communication": 0.0}, cut.grad

    def emb_step(self, fed: Any, batch: int, upstream: Any) -> Any:
        """Lookup, backward from the given d(loss)/d(pooled), update."""
        pooled = self.tables.forward(fed, batch)
        pooled.backward(upstream)
        self.tables.after_backward()
        return pooled


# -------------------------------------------------------------------------------- run


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the model, run warm-up + timed steps three ways, return the side's report."""
    check_spec(spec)
    import torch

    ids, dense, labels = baseline_tfra.load_batches(Path(spec["batches_dir"]),
                                                    len(spec["inputs"]))
    count = dense.shape[0]
    batch_digest = measure.digest(x for k in range(count)
                                  for x in (*(i[k] for i in ids), dense[k], labels[k]))
    started = time.perf_counter()
    model = PeerModel(spec)
    build_seconds = time.perf_counter() - started
    dense_t = [torch.from_numpy(dense[k]) for k in range(count)]
    labels_t = [torch.from_numpy(labels[k]) for k in range(count)]

    def inputs(k: int) -> tuple[Any, Any, Any]:
        return model.tables.feed([x[k] for x in ids]), dense_t[k], labels_t[k]

    measured = measure.measure_steps(
        spec["kernel"], inputs, count, int(spec["warmup"]), int(spec["steps"]), model.step,
        model.phased_step, lambda x, d, grads: model.emb_step(x, d.shape[0], grads))
    versions = {"torch": torch.__version__, "python": sys.version.split()[0],
                "threads": torch.get_num_threads()}
    if spec["kernel"] == "fbgemm":
        import fbgemm_gpu

        versions["fbgemm_gpu"] = fbgemm_gpu.__version__
    return {
        "side": spec["side"],
        "build_seconds": build_seconds,
        "batch_digest": batch_digest,
        "fused_runs": FUSED_RUNS[spec["kernel"]],
        "versions": versions,
        "batch_bytes": sum(a.nbytes for a in ids) + dense.nbytes + labels.nbytes,
        **measured,
    }


# ------------------------------------------------------------------------------ check


def check_case(case: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One embedding step on given weights: ``pooled`` (``[batch, sum of dims]``) and each
    table's weights after the update from ``upstream`` (d(loss)/d(pooled)).

    ``case``: ``kernel``, ``learning_rate``, ``rows``, ``dims``, ``input_tables`` (the table
    of each input), ``w_<t>`` (table t's weights), ``ids_<i>`` (``[batch, hotness]``),
    ``upstream``."""
    import torch

    kernel = str(case["kernel"])
    rows, dims = case["rows"].tolist(), case["dims"].tolist()
    tables = [{"name": str(t), "rows": r, "dim": d}
              for t, (r, d) in enumerate(zip(rows, dims, strict=True))]
    ids = [case[f"ids_{i}"] for i in range(len(case["input_tables"]))]
    inputs = [{"table": str(t), "hotness": int(x.shape[1]), "dim": dims[int(t)]}
              for t, x in zip(case["input_tables"].tolist(), ids, strict=True)]
    emb = make_tables(kernel, tables, inputs, float(case["learning_rate"]))
    with torch.no_grad():
        for t, w in enumerate(emb.weights()):
            w.copy_(torch.from_numpy(case[f"w_{t}"]))
    batch = int(ids[0].shape[0])
    pooled = emb.forward(emb.feed(ids), batch)
    out = {"pooled": pooled.detach().numpy().copy()}
    pooled.backward(torch.from_numpy(case["upstream"]))
    emb.after_backward()
    for t, w in enumerate(emb.weights()):
        out[f"w_{t}"] = w.detach().numpy().copy()
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``SPEC.json`` (writes the report to ``spec['out']``) or ``--check CASE
    OUT``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "--check":
        case = dict(np.load(args[1]))
        np.savez(args[2], **check_case(case))
        return 0
    return measure.child_main("baseline_fbgemm", args, check_spec, run,
                              "baseline_fbgemm.py SPEC.json | --check CASE.npz OUT.npz")


if __name__ == "__main__":
    sys.exit(main())
