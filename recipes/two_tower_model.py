"""A two-tower model for `model: {type: keras, build: "two_tower_model:build"}`.

The user tower reads the features named in ``options.user`` and the dense columns; the item
tower reads every other feature. Each tower is an MLP (``options.hidden``) ending in an
``options.dim``-wide vector; the logit is their dot product plus a bias.
"""

from __future__ import annotations

from typing import Any


def build(inputs: Any, options: dict[str, Any]) -> Any:
    import keras

    user_names = set(options.get("user", []))
    hidden = list(options.get("hidden", [64]))
    dim = int(options.get("dim", 16))
    features = {f.name: keras.Input((f.width,), name=f.name) for f in inputs.features}
    dense = keras.Input((inputs.dense_width,), name=inputs.dense_name) if inputs.dense_width else None

    def tower(parts: list[Any], name: str) -> Any:
        x = parts[0] if len(parts) == 1 else keras.layers.Concatenate(name=f"{name}_concat")(parts)
        for i, units in enumerate(hidden):
            x = keras.layers.Dense(units, activation="relu", name=f"{name}_{i}")(x)
        return keras.layers.Dense(dim, name=f"{name}_out")(x)

    user_parts = [features[n] for n in features if n in user_names]
    if dense is not None:
        user_parts.append(dense)
    item_parts = [features[n] for n in features if n not in user_names]
    dot = keras.layers.Dot(axes=1, name="dot")([tower(user_parts, "user"), tower(item_parts, "item")])
    logit = keras.layers.Dense(1, name="logit")(dot)
    model_inputs = list(features.values()) + ([dense] if dense is not None else [])
    return keras.Model(inputs=model_inputs, outputs=logit, name="two_tower")
