"""Pooled vectors handed to the network in its compute dtype (issue 30): one CPU rank under
`train.mixed_precision: bf16 | fp16` writes the group arrays in bfloat16/float16 and reads the
network's bfloat16 gradients as they are.

* the engine's half outputs are its float32 outputs rounded to nearest (ties to even), as
  ml_dtypes/NumPy (and TensorFlow's cast on the network's entry) round them, bit for bit,
  at every batch size, combiner and table dtype, edge values included;
* an update from bfloat16 gradients equals the update from their exact float32 widening;
* a trainer hands the network its compute dtype, and training with it equals training with
  float32 arrays bit for bit (losses, tables, dense weights).
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from embtrain.embedding.config import (
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.engine import EmbeddingEngine
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES

ROWS = {"a": 50, "b": 40}
FEATURES = [FeatureConfig("a_sum", "a", "sum"), FeatureConfig("a_mean", "a", "mean"),
            FeatureConfig("a_sqrtn", "a", "sqrtn"), FeatureConfig("b_one", "b", "sum", 1),
            FeatureConfig("b_cat", "b", "concat", 2)]
NUMPY_DTYPE = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _tables(dtype: str) -> list[TableConfig]:
    return [TableConfig("a", ROWS["a"], 8, dtype=dtype), TableConfig("b", ROWS["b"], 16)]


def _inputs(rng: np.random.Generator, batch: int) -> dict[str, SparseInput]:
    out = {}
    for f in FEATURES:
        if f.hotness == 1:
            lens = np.ones(batch, np.int64)
        else:
            lens = rng.integers(0, 3 if f.combiner == "concat" else 5, batch)
        offs = np.zeros(batch + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        keys = rng.integers(0, ROWS[f.table], int(offs[-1])).astype(np.int64)
        weights = rng.uniform(0.1, 3.0, keys.size).astype(np.float32) \
            if f.combiner != "concat" else None
        out[f.name] = SparseInput(keys, offs, weights, bag_size=1 if f.hotness == 1 else 0)
    return out


def _pattern(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16)


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("table_dtype", ["float32", "bfloat16"])
def test_half_outputs_are_the_float32_outputs_rounded_to_nearest(table_dtype: str,
                                                                 out_dtype: str) -> None:
    rng = np.random.default_rng(zlib_seed(table_dtype + out_dtype))
    opt = SparseOptimizerConfig("adagrad", lr=0.1)
    engine = EmbeddingEngine(_tables(table_dtype), FEATURES, opt, seed=3)
    # edge values in table b's rows (a one-hot sum feature pools a row as it is): ties to
    # even, the largest finite values, overflow to inf, subnormals, infinities, NaN
    edges = np.array([1.00390625, 1.01171875, 3.3895314e38, 3.4e38, -3.4e38, 65504.0,
                      65520.0, 1e-40, -1e-40, 6e-8, 2e-8, np.inf, -np.inf, np.nan, -0.0,
                      1.0 + 2**-8 + 2**-20], np.float32)
    state = engine.export_table("b")
    values = np.array(state.values, np.float32)
    values[:3] = np.resize(edges, (3, 16))
    engine.import_table("b", replace(state, values=values))
    for batch in (1, 7, 300, 1000):
        x = _inputs(rng, batch)
        x["b_one"].keys[: min(batch, 3)] = np.arange(min(batch, 3))
        full = [a.copy() for a in engine.forward(x, out=engine.new_outputs(batch),
                                                 training=False)]
        half = engine.forward(x, out=engine.new_outputs(batch, out_dtype), training=False)
        for f, h in zip(full, half, strict=True):
            assert h.dtype == np.dtype(NUMPY_DTYPE[out_dtype]) and h.shape == f.shape
            with np.errstate(over="ignore"):  # the values beyond float16's range: inf
                want = f.astype(NUMPY_DTYPE[out_dtype])
            nan = np.isnan(f)
            assert np.array_equal(np.isnan(h.astype(np.float32)), nan)
            assert np.array_equal(_pattern(h)[~nan], _pattern(want)[~nan]), batch


def zlib_seed(text: str) -> int:
    return zlib.crc32(text.encode())


@pytest.mark.parametrize("optimizer", OPTIMIZER_NAMES)
@pytest.mark.parametrize("table_dtype", ["float32", "bfloat16"])
def test_bfloat16_gradients_update_as_their_float32_widening(table_dtype: str,
                                                             optimizer: str) -> None:
    rng = np.random.default_rng(zlib_seed(table_dtype + optimizer))
    opt = SparseOptimizerConfig(optimizer, lr=0.05)
    wide = EmbeddingEngine(_tables(table_dtype), FEATURES, opt, seed=4)
    half = EmbeddingEngine(_tables(table_dtype), FEATURES, opt, seed=4)
    for step, batch in enumerate((300, 1, 64, 1000)):
        x = _inputs(rng, batch)
        outs_w = wide.forward(x, out=wide.new_outputs(batch))
        outs_h = half.forward(x, out=half.new_outputs(batch, "bfloat16"))
        grads = [rng.normal(0, 1, o.shape).astype(np.float32).astype(ml_dtypes.bfloat16)
                 for o in outs_w]
        assert all(g.dtype == h.dtype for g, h in zip(grads, outs_h, strict=True))
        wide.backward_update([g.astype(np.float32) for g in grads], step)
        half.backward_update(grads, step)
    for table in ROWS:
        a, b = wide.export_table(table), half.export_table(table)
        assert np.array_equal(np.asarray(a.values), np.asarray(b.values))
        assert a.slots.keys() == b.slots.keys()
        for name in a.slots:
            assert np.array_equal(np.asarray(a.slots[name]), np.asarray(b.slots[name]))


def test_an_engine_refuses_outputs_it_cannot_write() -> None:
    engine = EmbeddingEngine(_tables("float32"), FEATURES, SparseOptimizerConfig(), seed=1)
    assert engine.output_dtypes() == ("bfloat16", "float16")
    with pytest.raises(ValueError, match="writes float32 outputs or bfloat16 or float16, not int8"):
        engine.new_outputs(4, "int8")
    x = _inputs(np.random.default_rng(0), 4)
    with pytest.raises(ValueError, match=r"out\[0\] must be C-contiguous float32"):
        engine.forward(x, out=[np.zeros((4, w), np.float64) for w in (32, 32)])


RECIPE = """
version: 1
name: half-out
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 256}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
tables:
  - {{name: user, dim: 8, rows: 500, dtype: bfloat16}}
  - {{name: item, dim: 16, rows: 800}}
optimizer: {{sparse: {{type: adagrad, lr: 0.05}}, dense: {{type: adam, lr: 0.01}}}}
model: {{type: {model}}}
train: {{steps: 6, seed: 2, mixed_precision: {precision}}}
"""


@pytest.mark.parametrize(("model", "precision", "handed"), [
    ("mlp, hidden: [32, 16]", "bf16", "bfloat16"),
    ("dcn_v2, cross_layers: 1, deep: [16]", "fp16", "float16"),
    ("mlp, hidden: [16]", "none", "float32"),
])
def test_one_rank_hands_the_network_its_compute_dtype_and_trains_the_same(
        tmp_path: Path, model: str, precision: str, handed: str) -> None:
    from embtrain.data import BatchReader
    from embtrain.data.gen import GenConfig, generate
    from embtrain.plan import Topology, make_plan
    from embtrain.recipe import load_recipe
    from embtrain.train.builder import build_trainer

    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(data=tmp_path / "data", model=model, precision=precision))
    recipe = load_recipe(path)
    generate(recipe, tmp_path / "data", GenConfig(rows=1536, eval_rows=256, files=1, seed=1))
    plan = make_plan(recipe, Topology(1, None, 64 * 2**30, 2**40))
    runs = []
    for dtype in (None, "float32"):
        trainer = build_trainer(recipe, plan)
        if dtype is not None:  # the float32 arrays of before, cast by the network
            assert trainer.embedding.set_output_dtype(dtype)
        losses, handed_dtypes = [], set()
        for step, batch in enumerate(BatchReader(recipe, "train", seed=2)):
            handed_dtypes |= {g.dtype.name for g in trainer.forward(batch, training=False)}
            losses.append(trainer.step(batch, step))
        tables = {t: trainer.embedding.engine.export_table(t) for t in ("user", "item")}
        runs.append((losses, tables, trainer.model.get_weights(), handed_dtypes))
    (losses, tables, weights, dtypes), (losses32, tables32, weights32, dtypes32) = runs
    assert dtypes == {handed} and dtypes32 == {"float32"}
    assert losses == losses32 and len(losses) == 6
    for t in tables:
        assert np.array_equal(np.asarray(tables[t].values), np.asarray(tables32[t].values))
    for a, b in zip(weights, weights32, strict=True):
        assert np.array_equal(a, b)
