"""The dense networks' small test configuration: every model type's config, the feature slots
of two fused groups, a random batch."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import TypeAdapter

from embtrain.models import FeatureSlot
from embtrain.recipe.models import DenseModel as ModelUnion
from embtrain.recipe.models import DenseOptimizer

MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "mlp": {"type": "mlp", "hidden": [16, 8]},
    "dlrm": {"type": "dlrm", "bottom": [8, 4], "top": [16, 1]},
    "dcn_v2": {"type": "dcn_v2", "cross_layers": 2, "deep": [16], "structure": "parallel"},
    "deepfm": {"type": "deepfm", "deep": [16, 8]},
    "wide_deep": {"type": "wide_deep", "deep": [16, 8], "wide_features": ["c0", "lst"]},
}
TYPES = list(MODEL_CONFIGS)
VARIANTS: dict[str, dict[str, Any]] = {
    "dcn_v2/low_rank": {"type": "dcn_v2", "cross_layers": 2, "low_rank": 3, "deep": [16, 1]},
    "dlrm/cat": {"type": "dlrm", "bottom": [4], "top": [8], "interaction": "cat"},
    "wide_deep/all": {"type": "wide_deep", "deep": [8]},
}
MODEL_CONFIGS.update(VARIANTS)
NUM_DENSE = 3
# Group 0: three one-hot features of dim 4; group 1: a concat-combined list (hotness 2)
# and one more one-hot feature, all of dim 4.
SLOTS = [
    FeatureSlot("c0", 0, 0, 4, 4),
    FeatureSlot("c1", 0, 4, 4, 4),
    FeatureSlot("c2", 0, 8, 4, 4),
    FeatureSlot("lst", 1, 0, 8, 4),
    FeatureSlot("c3", 1, 8, 4, 4),
]
WIDTHS = [12, 12]


def model_config(kind: str, **changes: Any) -> Any:
    """A recipe model config parsed the way the recipe loader parses YAML."""
    return TypeAdapter(ModelUnion).validate_python({**MODEL_CONFIGS[kind], **changes})


def optimizer_config(**fields: Any) -> Any:
    return TypeAdapter(DenseOptimizer).validate_python(fields)


def batch(n: int, seed: int = 0, num_dense: int = NUM_DENSE) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n, num_dense), dtype=np.float32)
    groups = [0.5 * rng.standard_normal((n, w), dtype=np.float32) for w in WIDTHS]
    labels = (rng.random(n) < 0.4).astype(np.float32)
    return dense, groups, labels
