"""Runs dense steps on one Keras backend and saves what they produced (for
tests/test_dense_backends.py, which runs it once per backend in a fresh process: Keras picks
its backend once per process).

Usage: python tests/workers/dense_backend_worker.py BACKEND CASES.json INPUTS.npz OUT.npz
For each case: a model (``config``, ``labels``, ``optimizer``), its initial weights from the
inputs file where given (``weights`` prefix), three train steps on the case's batches, then
the model's gradients on a fourth batch; saved: every loss, group gradient, dense gradient,
each step's learning rate and labels' losses, the weights and the optimizer state after the
steps, and predict on the fourth batch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from embtrain.models.backend import select_backend


def main() -> None:
    backend, cases_path, inputs_path, out_path = sys.argv[1:5]
    select_backend(backend, "test")
    from pydantic import TypeAdapter

    from embtrain.models import build_model
    from embtrain.models.slots import FeatureSlot
    from embtrain.recipe.models import DenseModel as ModelUnion
    from embtrain.recipe.models import DenseOptimizer, Label
    from embtrain.train.job import configure_tensorflow

    cases = json.loads(Path(cases_path).read_text())
    inputs = np.load(inputs_path)
    out: dict[str, np.ndarray] = {}
    for name, case in cases.items():
        configure_tensorflow(0)
        slots = [FeatureSlot(*s) for s in case["slots"]]
        labels = [Label(**lab) for lab in case["labels"]] if case.get("labels") else None
        model = build_model(TypeAdapter(ModelUnion).validate_python(case["config"]),
                            case["num_dense"], slots, seed=5, labels=labels)
        model.make_optimizer(TypeAdapter(DenseOptimizer).validate_python(case["optimizer"]))
        if case.get("weights"):
            model.set_weights([inputs[f"{case['weights']}/w{i}"]
                               for i in range(len(model.get_weights()))])
        out[f"{name}/names"] = np.array(model.weight_names() + model.optimizer_state_names())
        for step in range(4):
            dense = inputs[f"{name}/{step}/dense"]
            groups = [inputs[f"{name}/{step}/g{g}"] for g in range(case["groups"])]
            y = inputs[f"{name}/{step}/labels"]
            if step < 3:
                loss, grads = model.train_step(dense, groups, y, global_batch_size=64)
                out[f"{name}/{step}/lr"] = np.array(model.learning_rate(), np.float32)
                if labels:
                    out[f"{name}/{step}/label_losses"] = model.label_losses()
            else:
                loss, grads, dense_grads = model.gradients(dense, groups, y)
                for i, d in enumerate(dense_grads):
                    out[f"{name}/dense_grad{i}"] = np.asarray(d)
                out[f"{name}/predict"] = model.predict(dense, groups)
            out[f"{name}/{step}/loss"] = np.array(loss)
            for g, grad in enumerate(grads):
                out[f"{name}/{step}/grad{g}"] = np.asarray(grad)
        for i, w in enumerate(model.get_weights()):
            out[f"{name}/w{i}"] = w
        for i, s in enumerate(model.optimizer_state()):
            out[f"{name}/opt{i}"] = s
    np.savez(out_path, **out)


if __name__ == "__main__":
    main()
