"""The dense step of DE tiny in float32 and under ``train.mixed_precision``, side by side.

    PYTHONPATH=<checkout> python benchmarks/dense_precision.py [--precision bf16] [--batch 65536]
                                   [--rounds 4] [--steps 3] [--kernels auto|native,float32]

Builds DE tiny's dense model (10 dense features + the embedding groups of its 55 tables, the
MLP 256-128-1, Adagrad) twice in one process, in float32 and in ``--precision``, feeds both the
same random 64-byte aligned inputs (as the engine hands them over), and times
:meth:`embtrain.models.DenseModel.train_step` in interleaved rounds. Prints one JSON line:
the median wall and CPU (process time, all threads) milliseconds of a step per side and the
float32 ÷ half ratios. CPU time is the steadier figure on a shared machine. To compare two
checkouts, run it under each one's ``PYTHONPATH`` in alternation. ``--kernels native,float32``
times the half side with each matmul kernel (:class:`embtrain.models.precision.Precision`'s
``kernel``: TensorFlow's half-type kernel, or operands widened to float32), one side each; run
with ``TF_ENABLE_ONEDNN_OPTS=0`` to get TensorFlow's kernels of a CPU without oneDNN's bfloat16
(an AVX2 CPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="steps per side per round")
    parser.add_argument("--kernels", default="auto",
                        help="comma-separated half matmul kernels: auto, native, float32")
    args = parser.parse_args()

    from embtrain.bench.synthetic import build_recipe, load_model
    from embtrain.embedding.from_recipe import (
        feature_configs,
        sparse_optimizer_config,
        table_configs,
    )
    from embtrain.embedding.sharded import ShardedEmbedding
    from embtrain.machine import cpu_summary
    from embtrain.models import aligned_empty, build_model
    from embtrain.models.precision import Precision, block_rows_for, half_kernel
    from embtrain.models.slots import feature_slots

    # tiny tables: only the layout (the network's input widths) matters here
    recipe = build_recipe(load_model("tiny"), optimizer="adagrad", batch=args.batch, scale=1e-4)
    embedding = ShardedEmbedding(table_configs(recipe), feature_configs(recipe),
                                 sparse_optimizer_config(recipe.optimizer.sparse), seed=0)
    slots = feature_slots(recipe, embedding.layout)
    num_dense = sum(len(f.columns) for f in recipe.dense_features)
    models = {}
    sides = [Precision("none")] + [Precision(args.precision, block_rows_for(args.batch), kernel)
                                   for kernel in args.kernels.split(",")]
    for precision in sides:
        model = build_model(recipe.model, num_dense=num_dense, slots=slots, seed=0,
                            precision=precision, batch_size=args.batch)
        model.make_optimizer(recipe.optimizer.dense)
        name = "none" if not precision.mixed else (
            f"{precision.name}/{half_kernel(precision.compute_dtype, precision.kernel)}")
        models[name] = model

    rng = np.random.default_rng(0)

    def filled(shape: tuple[int, ...], values: np.ndarray) -> np.ndarray:
        out = aligned_empty(shape)
        out[:] = values
        return out

    b = args.batch
    groups = [filled((b, w), 0.05 * rng.standard_normal((b, w), dtype=np.float32))
              for w in models["none"].group_widths]
    dense = filled((b, num_dense), rng.standard_normal((b, num_dense), dtype=np.float32))
    labels = filled((b,), (rng.random(b) < 0.3).astype(np.float32))
    for model in models.values():  # trace and warm up
        for _ in range(2):
            model.train_step(dense, groups, labels)
    times: dict[str, list[tuple[float, float]]] = {p: [] for p in models}
    for _ in range(args.rounds):
        for precision, model in models.items():
            for _ in range(args.steps):
                cpu, wall = time.process_time(), time.perf_counter()
                model.train_step(dense, groups, labels)
                times[precision].append(((time.perf_counter() - wall) * 1e3,
                                         (time.process_time() - cpu) * 1e3))
    out: dict[str, object] = {"batch": b, "cpu": cpu_summary(),
                              "group_widths": models["none"].group_widths}
    medians = {precision: {"wall_ms": statistics.median(w for w, _ in values),
                           "cpu_ms": statistics.median(c for _, c in values)}
               for precision, values in times.items()}
    out.update(medians)
    full = medians["none"]
    out["ratio_wall"] = {side: full["wall_ms"] / m["wall_ms"]
                         for side, m in medians.items() if side != "none"}
    out["ratio_cpu"] = {side: full["cpu_ms"] / m["cpu_ms"]
                        for side, m in medians.items() if side != "none"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
