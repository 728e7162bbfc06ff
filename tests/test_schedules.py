"""Learning-rate schedules: warm-up then constant, cosine or step decay, sparse and dense,
continued exactly by a resumed run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from embtrain.embedding.from_recipe import sparse_optimizer_config
from embtrain.embedding.optimizers import hyperparams
from embtrain.errors import RecipeError
from embtrain.recipe.loader import parse_recipe_text, recipe_fingerprint
from embtrain.recipe.models import Schedule

RECIPE = """
version: 1
name: sched
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 256}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
tables:
  - {{name: user, dim: 8, rows: 300}}
optimizer:
  sparse: {{type: adam, lr: 0.05{sparse}}}
  dense: {{type: adam, lr: 0.01{dense}}}
model: {{type: mlp, hidden: [16]}}
train: {{steps: 16, eval_every: 8, log_every: 4, checkpoint: {{every: 8}}, seed: 2}}
"""
SPARSE = ", schedule: {warmup_steps: 4, decay: cosine, decay_steps: 10, min_ratio: 0.1}"
DENSE = ", schedule: {warmup_steps: 3, decay: step, decay_steps: 4, decay_rate: 0.5}"


def reference(step: int, warmup: int, decay: str, steps: int, rate: float, floor: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    t = step - warmup
    if decay == "cosine":
        return floor + (1 - floor) * (1 + math.cos(math.pi * min(1.0, t / steps))) / 2
    if decay == "step":
        return rate ** (t // steps)
    return 1.0


@pytest.mark.parametrize("decay", ["constant", "cosine", "step"])
def test_factor_follows_the_formula(decay: str) -> None:
    s = Schedule(warmup_steps=5, decay=decay, decay_steps=7 if decay != "constant" else None,
                 decay_rate=0.3, min_ratio=0.2)
    got = [s.factor(t) for t in range(30)]
    want = [reference(t, 5, decay, 7, 0.3, 0.2) for t in range(30)]
    assert got == pytest.approx(want, rel=1e-12)
    assert got[0] == 0.2 and got[4] == 1.0


def test_recipe_schedules_and_their_mistakes() -> None:
    plain = parse_recipe_text(RECIPE.format(data="d", sparse="", dense=""))
    assert "schedule" not in plain.model_dump(mode="json")["optimizer"]["sparse"]
    with_s = parse_recipe_text(RECIPE.format(data="d", sparse=SPARSE, dense=DENSE))
    assert recipe_fingerprint(with_s) != recipe_fingerprint(plain)
    with pytest.raises(RecipeError) as info:
        parse_recipe_text(RECIPE.format(data="d", sparse=", schedule: {decay: cosine}", dense=""),
                          "r.yaml")
    assert info.value.lines == ["r.yaml:11:34: optimizer.sparse.schedule: decay: cosine needs "
                                "decay_steps"]


def test_sparse_hyperparameters_use_the_scheduled_lr() -> None:
    recipe = parse_recipe_text(RECIPE.format(data="d", sparse=SPARSE, dense=""))
    cfg = sparse_optimizer_config(recipe.optimizer.sparse)
    s = recipe.optimizer.sparse.schedule
    for step in (0, 3, 4, 9, 20):
        hp = hyperparams(cfg, step)
        assert hp[0] == np.float32(0.05 * s.factor(step))
    assert hyperparams(sparse_optimizer_config(
        parse_recipe_text(RECIPE.format(data="d", sparse="", dense="")).optimizer.sparse), 7)[0] \
        == np.float32(0.05)


KINDS = {  # a schedule of each kind, for both optimizers
    "constant": ", schedule: {warmup_steps: 3}",
    "cosine": ", schedule: {warmup_steps: 2, decay: cosine, decay_steps: 5, min_ratio: 0.2}",
    "step": DENSE,
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_dense_optimizer_uses_the_scheduled_lr(kind: str) -> None:
    import tensorflow as tf

    from embtrain.models.model import make_keras_optimizer

    recipe = parse_recipe_text(RECIPE.format(data="d", sparse="", dense=KINDS[kind]))
    opt = make_keras_optimizer(recipe)
    s = recipe.optimizer.dense.schedule
    for step in (0, 2, 3, 6, 7, 11, 30):  # as Keras calls it: with its int64 iteration count
        got = opt._learning_rate(tf.constant(step, tf.int64))
        assert got.dtype == tf.float32
        assert float(got) == pytest.approx(0.01 * s.factor(step), rel=1e-6)


@pytest.mark.parametrize("kind", [None, *sorted(KINDS)])
def test_every_schedule_trains_and_logs_its_rates(tmp_path: Path, kind: str | None) -> None:
    """A few steps with a schedule of each kind on both optimizers (none: the constant lr);
    every step's logged learning rates follow the formula."""
    from embtrain import api
    from embtrain.data.gen import GenConfig, generate

    schedule = KINDS[kind] if kind else ""
    text = RECIPE.format(data=tmp_path / "data", sparse=schedule, dense=schedule).replace(
        "steps: 16, eval_every: 8, log_every: 4, checkpoint: {every: 8}",
        "steps: 9, eval_every: 100, log_every: 1")
    recipe = parse_recipe_text(text)
    generate(recipe, tmp_path / "data", GenConfig(rows=1500, eval_rows=300, files=1, seed=4))
    api.run(recipe, tmp_path / "run")
    train = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text()
                            .splitlines()) if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 10))
    for r in train:
        t = r["step"] - 1  # the 0-based step the logged update belongs to
        factor = 1.0 if kind is None else reference(
            t, recipe.optimizer.sparse.schedule.warmup_steps, recipe.optimizer.sparse.schedule.decay,
            recipe.optimizer.sparse.schedule.decay_steps or 1,
            recipe.optimizer.sparse.schedule.decay_rate,
            recipe.optimizer.sparse.schedule.min_ratio)
        assert r["lr_sparse"] == float(np.float32(0.05 * factor))
        assert r["lr_dense"] == pytest.approx(0.01 * factor, rel=1e-6)
        assert np.isfinite(r["loss"])


def _records(run_dir: Path) -> list[dict]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] in ("train", "eval"):
            out.append({k: v for k, v in r.items() if k not in ("samples_per_s", "seconds")})
    return out


def test_a_resumed_run_continues_both_schedules_exactly(cli, tmp_path: Path) -> None:
    from embtrain.data.gen import GenConfig, generate

    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(data=tmp_path / "data", sparse=SPARSE, dense=DENSE))
    recipe = parse_recipe_text(path.read_text())
    generate(recipe, tmp_path / "data", GenConfig(rows=3000, eval_rows=500, files=2, seed=3))
    assert cli("run", str(path), "--run-dir", str(tmp_path / "a")).returncode == 0
    res = cli("run", str(path), "--run-dir", str(tmp_path / "b"), "--max-steps", "8")
    assert res.returncode == 0, res.stderr
    res = cli("run", "--resume", str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr
    assert _records(tmp_path / "b") == _records(tmp_path / "a")
