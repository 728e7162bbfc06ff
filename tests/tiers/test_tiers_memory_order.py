"""A tier is storage, not model: a recipe with a tiered table computes bit for bit as the same
recipe all in memory, also when the tiered table shares its dim with other tables (it then
sits in a fused group of its own, and the dense network must still see the in-memory
order and blocks of its input: issue 29, item 5)."""

from __future__ import annotations

import numpy as np
import pytest

TIER = "    storage: [{tier: device, budget: 64KiB}, {tier: host}]"

# a (tiered) and c share dim 16 and a group in memory; b (dim 8) sits between them in recipe
# order, so a fused group of a's own would also move c before b in the network's input.
MIXED = """
version: 1
name: order
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 256}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: item, column: item_id, table: a}}
  - {{kind: categorical, name: user8, column: user_id, table: b}}
  - {{kind: categorical, name: user16, column: user_id, table: c}}
tables:
  - name: a
    dim: 16
    rows: 20000
{storage}
  - {{name: b, dim: 8, rows: 2000}}
  - {{name: c, dim: 16, rows: 2000}}
optimizer: {{sparse: {{type: adagrad, lr: 0.01}}, dense: {{type: adam, lr: 0.001}}}}
model: {model}
train: {{steps: 8, eval_every: 8, log_every: 1, seed: 0}}
"""

# every table dim 8; a and c tiered: in memory one group, with tiers a and c in one group and
# b in another, so the in-memory group's columns come from two group arrays
COMMON_DIM = """
version: 1
name: order
data: {{train: data/train/*.parquet, eval: data/eval/*.parquet, batch_size: 64}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2]}}
  - {{kind: categorical, name: f_a, column: a, table: a}}
  - {{kind: categorical, name: f_b, column: b, table: b}}
  - {{kind: categorical, name: f_c, column: c, table: c}}
tables:
  - name: a
    dim: 8
    rows: 20000
{storage}
  - {{name: b, dim: 8, rows: 2000}}
  - name: c
    dim: 8
    rows: 20000
{storage}
optimizer: {{sparse: {{type: sgd, lr: 0.01}}, dense: {{type: sgd, lr: 0.01}}}}
model: {model}
train: {{steps: 1, seed: 0}}
"""

# the shape of recipes/tiered.yaml: the tiered table after an in-memory one of its dim (the
# input order stays; the in-memory group's one block becomes two runs)
PAIR = """
version: 1
name: pair
data: {{train: data/train/*.parquet, eval: data/eval/*.parquet, batch_size: 64}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2]}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
tables:
  - {{name: user, dim: 16, rows: 2000}}
  - name: item
    dim: 16
    rows: 50000
{storage}
optimizer: {{sparse: {{type: sgd, lr: 0.01}}, dense: {{type: sgd, lr: 0.01}}}}
model: {model}
train: {{steps: 1, seed: 0}}
"""

MODELS_MIXED = ["{type: mlp, hidden: [16]}", "{type: dcn_v2, cross_layers: 1, deep: [8]}",
                "{type: wide_deep, deep: [8], wide_features: [user16, item]}"]
MODELS_COMMON = ["{type: dlrm, bottom: [8], top: [8]}", "{type: deepfm, deep: [8]}",
                 "{type: mlp, hidden: [8]}"]


def _slots(text):
    from embtrain.embedding.from_recipe import feature_configs, table_configs
    from embtrain.embedding.groups import fused_layout
    from embtrain.models.slots import feature_slots
    from embtrain.recipe.loader import parse_recipe_text

    recipe = parse_recipe_text(text)
    layout, widths = fused_layout(table_configs(recipe), feature_configs(recipe))
    return recipe, layout, widths, feature_slots(recipe, layout)


def _network_on(text, pooled):
    """Logits and d(sum logits)/d(each feature's pooled vector) of the recipe's network."""
    import tensorflow as tf

    from embtrain.models.networks import build_network

    recipe, layout, widths, slots = _slots(text)
    net, _ = build_network(recipe.model, 2, slots, seed=3)
    batch = next(iter(pooled.values())).shape[0]
    groups = [np.zeros((batch, w), np.float32) for w in widths]
    for name, (g, start, width) in layout.items():
        groups[g][:, start:start + width] = pooled[name]
    dense = tf.constant(np.linspace(-1, 1, batch * 2, dtype=np.float32).reshape(batch, 2))
    tensors = [tf.constant(g) for g in groups]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        logits = net(dense, tensors)
        total = tf.reduce_sum(logits)
    grads = [g.numpy() for g in tape.gradient(total, tensors)]
    per_feature = {name: grads[g][:, start:start + width]
                   for name, (g, start, width) in layout.items()}
    return logits.numpy(), per_feature, [s.name for s in slots]


@pytest.mark.parametrize(("template", "model", "dims", "groups"),
                         [(MIXED, m, {"item": 16, "user8": 8, "user16": 16}, 3)
                          for m in MODELS_MIXED]
                         + [(COMMON_DIM, m, {"f_a": 8, "f_b": 8, "f_c": 8}, 2)
                            for m in MODELS_COMMON]
                         + [(PAIR, "{type: mlp, hidden: [64, 32]}", {"user": 16, "item": 16}, 2)])
def test_network_on_tiered_layout_equals_in_memory_bit_for_bit(template, model, dims, groups):
    rng = np.random.default_rng(5)
    pooled = {name: rng.normal(size=(33, d)).astype(np.float32) for name, d in dims.items()}
    memory = _network_on(template.format(data="data", storage="", model=model), pooled)
    tiered_text = template.format(data="data", storage=TIER, model=model)
    _, layout, _, _ = _slots(tiered_text)
    assert len({g for g, _, _ in layout.values()}) == groups  # the tier does split the groups
    tiered = _network_on(tiered_text, pooled)
    assert tiered[2] == memory[2]  # the input order
    np.testing.assert_array_equal(tiered[0], memory[0])
    for name in dims:
        np.testing.assert_array_equal(tiered[1][name], memory[1][name], err_msg=name)


def test_input_blocks_join_runs_of_one_memory_group_only():
    from embtrain.models.slots import FeatureSlot, input_blocks, merge_runs

    slots = [FeatureSlot("a", 0, 0, 8, 8, memory_group=0), FeatureSlot("b", 1, 0, 8, 8, 0),
             FeatureSlot("c", 0, 8, 8, 8, 0), FeatureSlot("d", 2, 0, 4, 4, 1)]
    blocks = input_blocks(merge_runs(slots))
    assert [[r.names for r in b] for b in blocks] == [[("a",), ("b",), ("c",)], [("d",)]]
    # slots without a memory group (built by hand) stay one block per run, as before
    plain = [FeatureSlot("a", 0, 0, 8, 8), FeatureSlot("b", 1, 0, 8, 8)]
    assert len(input_blocks(merge_runs(plain))) == 2


@pytest.mark.slow
def test_run_with_a_tier_sharing_a_dim_equals_all_in_memory(tmp_path):
    """Through `run` and `dump`: losses and every dumped array equal bit for bit."""
    from embtrain.train.metrics_log import read_metrics
    from tests.support.cli import run_cli

    model = "{type: mlp, hidden: [16]}"
    paths = {}
    for name, storage in (("tiered", TIER), ("plain", "")):
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(MIXED.format(data=tmp_path / "data", storage=storage, model=model))
    res = run_cli("gen-data", "--recipe", str(paths["plain"]), "--out", str(tmp_path / "data"),
                  "--rows", "3000", "--eval-rows", "500")
    assert res.returncode == 0, res.stderr
    losses, dumps = {}, {}
    for name, path in paths.items():
        run_dir, out = tmp_path / f"run-{name}", tmp_path / f"dump-{name}"
        res = run_cli("run", str(path), "--run-dir", str(run_dir))
        assert res.returncode == 0, res.stderr
        losses[name] = [r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"]
        res = run_cli("dump", str(run_dir), str(out))
        assert res.returncode == 0, res.stderr
        dumps[name] = {str(p.relative_to(out)): np.load(p) for p in sorted(out.rglob("*.npy"))}
    tiers = [r["tiers"] for r in read_metrics(tmp_path / "run-tiered") if r["kind"] == "train"]
    assert tiers[-1]["a"]["evictions"] > 0  # the cache was too small for the rows seen
    assert losses["tiered"] == losses["plain"] and len(losses["plain"]) == 8
    assert dumps["tiered"].keys() == dumps["plain"].keys() and dumps["plain"]
    for key, value in dumps["plain"].items():
        np.testing.assert_array_equal(dumps["tiered"][key], value, err_msg=key)
