"""Several labels: data.labels, one head per label, the weighted loss, per-label metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embtrain.data import BatchReader
from embtrain.errors import DataError, RecipeError
from embtrain.recipe.loader import parse_recipe_text, recipe_fingerprint
from embtrain.recipe.models import Label
from embtrain.train.metrics_log import _scalars

RECIPE = """
version: 1
name: labels
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 256{labels}}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
tables:
  - {{name: user, dim: 8, rows: 300}}
optimizer: {{sparse: {{type: adagrad, lr: 0.2}}, dense: {{type: adam, lr: 0.01}}}}
model: {model}
train: {{steps: 40, eval_every: 20, log_every: 10, seed: 1}}
"""

MAPPING = ", labels: {ctr: {column: label}, buy: {column: label2, weight: 0.5}, dwell: {column: dwell, loss: mse}}"


def recipe_text(data: Path | str, labels: str = MAPPING, model: str = "{type: mlp, hidden: [16]}") -> str:
    return RECIPE.format(data=data, labels=labels, model=model)


def test_labels_parse_as_a_list_or_a_mapping() -> None:
    r = parse_recipe_text(recipe_text("d"))
    assert r.data.label_specs() == [Label(name="ctr", column="label"),
                                    Label(name="buy", column="label2", weight=0.5),
                                    Label(name="dwell", column="dwell", loss="mse")]
    r = parse_recipe_text(recipe_text("d", ", labels: [label, label2]"))
    assert [(lab.name, lab.loss) for lab in r.data.label_specs()] == [("label", "bce"),
                                                                      ("label2", "bce")]
    one = parse_recipe_text(recipe_text("d", ""))
    assert one.data.label_specs() == [Label(name="label", column="label")]
    assert "labels" not in one.model_dump(mode="json")["data"]  # old fingerprints unchanged
    assert recipe_fingerprint(one) != recipe_fingerprint(r)


@pytest.mark.parametrize("labels,line", [
    (", label: y, labels: [a]", "r.yaml:4:1: data: give data.label or data.labels, not both"),
    (", labels: [a, a]", "r.yaml:4:1: data: data.labels names a column twice"),
    (", labels: []", "r.yaml:4:75: data.labels: List should have at least 1 item after "
                     "validation, not 0"),
    (", labels: {a: {column: a, loss: mae}}",
     "r.yaml:4:99: data.labels.a.loss: Input should be 'bce' or 'mse'"),
])
def test_label_mistakes_are_located_lines(labels: str, line: str) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe_text(recipe_text("d", labels), "r.yaml")
    assert info.value.lines == [line]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gen-data rows plus a second click label (the first, 15 % flipped) and a real one."""
    from embtrain.data.gen import GenConfig, generate

    root = tmp_path_factory.mktemp("labels")
    generate(parse_recipe_text(recipe_text(root, "")), root, GenConfig(rows=6000, eval_rows=2000,
                                                                         files=2, seed=4))
    rng = np.random.default_rng(0)
    for path in sorted(root.glob("*/*.parquet")):
        t = pq.read_table(path)
        y = t.column("label").to_numpy()
        flip = rng.random(len(y)) < 0.15
        i1 = t.column("I1").to_numpy(zero_copy_only=False).astype(np.float64)
        dwell = np.sign(i1) * np.log1p(np.abs(i1)) * 2.0 + y * 3.0 + rng.normal(0, 0.3, len(y))
        t = t.append_column("label2", pa.array(np.where(flip, 1 - y, y).astype(np.int8)))
        t = t.append_column("dwell", pa.array(dwell.astype(np.float32)))
        pq.write_table(t, path)
    return root


def test_reader_gives_one_column_per_label(data: Path) -> None:
    r = parse_recipe_text(recipe_text(data))
    batch = next(iter(BatchReader(r, "train")))
    assert batch.label.shape == (256, 3) and batch.label.dtype == np.float32
    table = pq.read_table(sorted((data / "train").glob("*.parquet"))[0])
    order = BatchReader(r, "train")
    assert order.spec.label_columns == (("label", "bce"), ("label2", "bce"), ("dwell", "mse"))
    # an mse label may be any finite number; a bce label must lie in [0, 1]
    assert (batch.label[:, 2] > 1).any()
    assert set(np.unique(table.column("label2").to_numpy())) <= {0, 1}


def test_a_bce_label_outside_0_1_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d" / "train").mkdir(parents=True)
    pq.write_table(pa.table({"I1": [1.0, 2.0], "I2": [1.0, 2.0], "user_id": [1, 2],
                             "label": [0, 1], "label2": [0, 2], "dwell": [5.0, -3.0]}),
                   tmp_path / "d" / "train" / "p.parquet")
    r = parse_recipe_text(recipe_text("d").replace(", eval: d/eval/*.parquet", "")
                          .replace("batch_size: 256", "batch_size: 2"))
    with pytest.raises(DataError) as info:
        list(BatchReader(r, "train"))
    assert str(info.value) == ("d/train/p.parquet: column 'label2' (label): value 2 at row 1 is "
                               "outside [0, 1] (a label is a click 0/1 or a probability)")


def test_per_label_metrics_reach_tensorboard_names() -> None:
    record = {"kind": "eval", "step": 3, "auc": 0.7, "labels": {"ctr": {"auc": 0.7, "logloss": 0.5},
                                                                 "dwell": {"mse": 2.0}}}
    assert _scalars(record)[2:] == [("labels/ctr/auc", 0.7), ("labels/ctr/logloss", 0.5),
                                    ("labels/dwell/mse", 2.0)]
    train = {"kind": "train", "step": 3, "loss": 0.9, "lr_sparse": 0.2, "lr_dense": 0.01,
             "labels": {"ctr": {"loss": 0.6}, "dwell": {"loss": 0.3}}}
    assert _scalars(train)[2:] == [("lr_sparse", 0.2), ("lr_dense", 0.01),
                                   ("labels/ctr/loss", 0.6), ("labels/dwell/loss", 0.3)]


def test_weighted_loss_is_the_sum_of_each_heads_loss() -> None:
    import tensorflow as tf

    from embtrain.models import build_model
    from embtrain.recipe.models import MMoEModel

    labels = [Label(name="a", column="a"), Label(name="b", column="b", loss="mse", weight=0.25)]
    model = build_model(MMoEModel(type="mmoe", experts=3, expert=[8, 4], tower=[4]), 5, [], 7,
                        labels=labels)
    rng = np.random.default_rng(1)
    dense = rng.normal(size=(32, 5)).astype(np.float32)
    y = np.stack([rng.integers(0, 2, 32), rng.normal(size=32)], axis=1).astype(np.float32)
    loss, _, grads = model.gradients(dense, [], y, global_batch_size=64)
    logits = model.network(tf.constant(dense), []).numpy().astype(np.float64)
    z, t = logits[:, 0], y[:, 0].astype(np.float64)
    bce = np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))
    want = (bce.sum() + 0.25 * np.square(logits[:, 1] - y[:, 1]).sum()) / 64
    assert loss == pytest.approx(want, rel=1e-5)
    # each label's own loss, not weighted, as a share of the global batch
    np.testing.assert_allclose(model.label_losses(),
                               [bce.sum() / 64, np.square(logits[:, 1] - y[:, 1]).sum() / 64],
                               rtol=1e-5)
    p = model.predict(dense, [])
    assert p.shape == (32, 2)
    np.testing.assert_allclose(p[:, 0], 1 / (1 + np.exp(-logits[:, 0])), rtol=1e-5)
    np.testing.assert_allclose(p[:, 1], logits[:, 1], rtol=1e-6)
    assert len(grads) == len(model.trainable_variables) and all(np.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("model", ["{type: mmoe, experts: 3, expert: [16], tower: [8]}",
                                   "{type: dlrm, bottom: [16, 8], top: [16, 1]}"])
def test_several_labels_train_and_report_each(cli, data: Path, tmp_path: Path, model: str) -> None:
    path = tmp_path / "r.yaml"
    text, steps = recipe_text(data, model=model), [20, 40]
    if "dlrm" in model:  # its dot interaction learns slower: 40 steps leave ctr at chance
        text, steps = text.replace("steps: 40, eval_every: 20", "steps: 80, eval_every: 40"), [40, 80]
    path.write_text(text)
    res = cli("run", str(path), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in
               (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    # every logged step: each label's training loss; the run's loss is their weighted sum
    train = [r for r in records if r["kind"] == "train"]
    total = steps[-1]
    assert [r["step"] for r in train] == list(range(10, total + 1, 10))
    for r in train:
        parts = r["labels"]
        assert set(parts) == {"ctr", "buy", "dwell"} and all(v["loss"] > 0 for v in parts.values())
        assert r["loss"] == pytest.approx(parts["ctr"]["loss"] + 0.5 * parts["buy"]["loss"]
                                          + parts["dwell"]["loss"], rel=1e-5)
        assert (r["lr_sparse"], r["lr_dense"]) == (pytest.approx(0.2), pytest.approx(0.01))
        shown = next(line for line in res.stdout.splitlines()
                     if f" step {r['step']}/{total} " in line)
        assert (f"ctr {parts['ctr']['loss']:.4f}  buy {parts['buy']['loss']:.4f}  "
                f"dwell {parts['dwell']['loss']:.4f}  lr 0.2/0.01") in shown
    assert [e["step"] for e in evals] == steps
    last = evals[-1]["labels"]
    assert set(last) == {"ctr", "buy", "dwell"}
    assert 0.6 < last["ctr"]["auc"] <= 1 and 0.55 < last["buy"]["auc"] <= 1
    assert last["ctr"]["auc"] > last["buy"]["auc"]  # the flipped copy is harder
    assert last["ctr"]["logloss"] > 0 and set(last["dwell"]) == {"mse"}
    assert last["dwell"]["mse"] < evals[0]["labels"]["dwell"]["mse"] * 1.5
    assert evals[-1]["auc"] == last["ctr"]["auc"]  # the top-level figures: the first label's
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["evals"][-1]["labels"] == last
    # the end-of-run summary shows every label's figures, not only the first's
    assert res.stdout.splitlines()[-3:] == [
        f"eval ctr: AUC {last['ctr']['auc']:.4f}  logloss {last['ctr']['logloss']:.4f}",
        f"eval buy: AUC {last['buy']['auc']:.4f}  logloss {last['buy']['logloss']:.4f}",
        f"eval dwell: MSE {last['dwell']['mse']:.4f}"]


def test_mmoe_network_equals_a_numpy_reference() -> None:
    """The built-in mmoe: experts, per-label softmax gates and towers, written out in NumPy."""
    from embtrain.models import build_model
    from embtrain.models.slots import FeatureSlot
    from embtrain.recipe.models import MMoEModel

    labels = [Label(name="a", column="a"), Label(name="b", column="b")]
    slots = [FeatureSlot("u", 0, 0, 4, 4), FeatureSlot("v", 0, 4, 4, 4)]
    model = build_model(MMoEModel(type="mmoe", experts=3, expert=[8, 6], tower=[5, 1]), 2, slots,
                        11, labels=labels)
    w = {name.removesuffix(":0"): v
         for name, v in zip(model.weight_names(), model.get_weights(), strict=True)}
    rng = np.random.default_rng(5)
    dense = rng.normal(size=(16, 2)).astype(np.float32)
    group = rng.normal(size=(16, 8)).astype(np.float32)
    x = np.concatenate([dense, group], axis=1).astype(np.float64)

    def layer(h: np.ndarray, name: str, relu: bool) -> np.ndarray:
        y = h @ w[f"{name}/kernel"] + w[f"{name}/bias"]
        return np.maximum(y, 0) if relu else y

    experts = []
    for k in range(3):
        h = x
        for i in range(2):
            h = layer(h, f"mmoe/expert/{k}/{i}", True)
        experts.append(h)
    stacked = np.stack(experts, axis=1)
    want = []
    for t in range(2):
        g = layer(x, f"mmoe/gate/{t}", False)
        g = np.exp(g - g.max(axis=1, keepdims=True))
        g /= g.sum(axis=1, keepdims=True)
        h = layer((stacked * g[:, :, None]).sum(axis=1), f"mmoe/tower/{t}/0", True)
        want.append(layer(h, f"mmoe/out/{t}", False)[:, 0])
    probs = 1 / (1 + np.exp(-np.stack(want, axis=1)))
    np.testing.assert_allclose(model.predict(dense, [group]), probs, rtol=1e-5, atol=1e-6)


def test_gen_data_writes_every_label(tmp_path: Path) -> None:
    import embtrain.api as et

    root = tmp_path / "g"
    labels = ", labels: {ctr: {column: click}, buy: {column: buy}, dwell: {column: dwell, loss: mse}}"
    et.gen_data(parse_recipe_text(recipe_text(root, labels)), root, rows=3000, eval_rows=500,
                files=1, seed=3)
    t = pq.read_table(sorted((root / "train").glob("*.parquet"))[0])
    assert "label" not in t.column_names  # the click is written under the first label's column
    click, buy = t.column("click").to_numpy(), t.column("buy").to_numpy()
    assert t.schema.field("dwell").type == pa.float32()
    assert set(np.unique(buy)) == {0, 1} and (buy <= click).all() and 0 < buy.sum() < click.sum()
    again = tmp_path / "h"
    et.gen_data(parse_recipe_text(recipe_text(again, labels)), again, rows=3000, eval_rows=500,
                files=1, seed=3)
    assert pq.read_table(sorted((again / "train").glob("*.parquet"))[0]).equals(t)


def test_predict_writes_a_column_per_label(cli, data: Path, tmp_path: Path) -> None:
    """predict on the eval split: one probability/logit pair per bce label, the prediction of an
    mse label, each label's AUC / logloss / MSE equal to the run's last eval."""
    from embtrain.metrics import auc, logloss, mse

    path = tmp_path / "r.yaml"
    path.write_text(recipe_text(data))
    assert cli("run", str(path), "--run-dir", str(tmp_path / "run")).returncode == 0
    out = tmp_path / "p.parquet"
    res = cli("predict", str(tmp_path / "run"), "--data", str(data / "eval" / "*.parquet"),
              "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    got = pq.read_table(out)
    assert got.column_names == ["ctr_probability", "ctr_logit", "buy_probability", "buy_logit",
                                "dwell_prediction"]
    truth = pa.concat_tables([pq.read_table(f) for f in sorted((data / "eval").glob("*.parquet"))])
    last = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "eval"][-1]["labels"]
    y = {c: truth.column(c).to_numpy().astype(np.float32) for c in ("label", "label2", "dwell")}
    p = {c: got.column(c).to_numpy() for c in got.column_names}
    np.testing.assert_allclose(auc(y["label"], p["ctr_probability"]), last["ctr"]["auc"], atol=1e-6)
    np.testing.assert_allclose(logloss(y["label2"], p["buy_probability"]), last["buy"]["logloss"],
                               atol=1e-6)
    np.testing.assert_allclose(mse(y["dwell"], p["dwell_prediction"]), last["dwell"]["mse"], rtol=1e-5)
    np.testing.assert_allclose(1 / (1 + np.exp(-p["ctr_logit"])), p["ctr_probability"], rtol=1e-5)
    reported = json.loads(res.stdout)
    assert reported["auc"] == pytest.approx(last["ctr"]["auc"], abs=1e-6)
    assert set(reported["labels"]) == {"ctr", "buy", "dwell"}  # every label's, not the first's
    for name, metrics in last.items():
        assert reported["labels"][name] == pytest.approx(metrics, rel=1e-5, abs=1e-6)


def test_a_several_label_recipe_survives_its_own_yaml(data: Path) -> None:
    """The run directory's recipe.yaml (every default written out) loads back as the same
    recipe: resume and predict read it."""
    from embtrain.recipe.loader import recipe_to_yaml

    r = parse_recipe_text(recipe_text(data))
    again = parse_recipe_text(recipe_to_yaml(r))
    assert again == r and recipe_fingerprint(again) == recipe_fingerprint(r)


def test_each_labels_loss_is_the_global_batchs_on_two_ranks(cli, data: Path,
                                                            tmp_path: Path) -> None:
    """Two ranks sum their shares of each label's loss with the step's loss: the records
    equal one process's."""
    path = tmp_path / "r.yaml"
    path.write_text(recipe_text(data).replace("steps: 40, eval_every: 20", "steps: 20, eval_every: 20"))
    runs = []
    for extra in ([], ["--np", "2"]):
        res = cli("run", str(path), "--run-dir", str(tmp_path / f"run{len(extra)}"), *extra)
        assert res.returncode == 0, res.stderr[-2000:]
        runs.append([r for r in map(json.loads, (tmp_path / f"run{len(extra)}" / "metrics.jsonl")
                                    .read_text().splitlines()) if r["kind"] == "train"])
    one, two = runs
    assert [r["step"] for r in two] == [10, 20]
    for a, b in zip(one, two, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        for name in ("ctr", "buy", "dwell"):
            assert b["labels"][name]["loss"] == pytest.approx(a["labels"][name]["loss"], rel=1e-4)
        assert b["loss"] == pytest.approx(b["labels"]["ctr"]["loss"] + 0.5 * b["labels"]["buy"]["loss"]
                                          + b["labels"]["dwell"]["loss"], rel=1e-5)
