"""An MMoE model for `model: {type: keras, build: "keras_mmoe_model:build"}`.

``options.experts`` expert MLPs (``options.expert`` units) share the concatenated inputs;
per label a softmax gate mixes them and a tower (``options.tower``) ends in that label's
logit. The output is a dict keyed by label name, as embtrain expects with several labels.
"""

from __future__ import annotations

from typing import Any


def build(inputs: Any, options: dict[str, Any]) -> Any:
    import keras

    n_experts = int(options.get("experts", 4))
    expert_units = list(options.get("expert", [32]))
    tower_units = list(options.get("tower", [16]))
    model_inputs = [keras.Input((f.width,), name=f.name) for f in inputs.features]
    if inputs.dense_width:
        model_inputs.append(keras.Input((inputs.dense_width,), name=inputs.dense_name))
    x = keras.layers.Concatenate(name="inputs")(model_inputs) if len(model_inputs) > 1 \
        else model_inputs[0]

    experts = []
    for k in range(n_experts):
        h = x
        for i, units in enumerate(expert_units):
            h = keras.layers.Dense(units, activation="relu", name=f"expert{k}_{i}")(h)
        experts.append(keras.layers.Reshape((1, expert_units[-1]), name=f"expert{k}_row")(h))
    stacked = keras.layers.Concatenate(axis=1, name="experts")(experts)  # [b, experts, units]

    outputs = {}
    for label in inputs.labels:
        gate = keras.layers.Dense(n_experts, activation="softmax", name=f"{label}_gate")(x)
        gate = keras.layers.Reshape((n_experts, 1), name=f"{label}_gate_col")(gate)
        mixed = keras.layers.Dot(axes=1, name=f"{label}_mix")([gate, stacked])  # [b, 1, units]
        h = keras.layers.Flatten(name=f"{label}_flat")(mixed)
        for i, units in enumerate(tower_units):
            h = keras.layers.Dense(units, activation="relu", name=f"{label}_tower{i}")(h)
        outputs[label] = keras.layers.Dense(1, name=label)(h)
    return keras.Model(inputs=model_inputs, outputs=outputs, name="mmoe")
