"""`embtrain export --format saved_model`: a SavedModel that needs TensorFlow only.

A separate process in which ``import embtrain`` fails loads each export and reproduces
`embtrain predict`'s probabilities to 1e-5: every model type over one recipe with every
feature kind, a 2-rank run with row-sharded static and dynamic tables, a tiered run. The
TensorFlow string hash equals training's; unseen ids, nulls, empty lists and out-of-range ids
get their documented outcome; a model over the limit and an existing version are refused.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.support.cli import REPO, run_cli
from tests.support.serving import (
    MODELS,
    TIERED,
    recipe_with_model,
    score_without_embtrain,
    train_run,
)

SHARDED = {"{name: user, dim: 4, rows: 50}": "{name: user, dim: 4, rows: 50, sharding: row}",
           "{name: dyn, dim: 4, dynamic: {capacity: 2000}}":
           "{name: dyn, dim: 4, sharding: row, dynamic: {capacity: 2000, missing: initial}}"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    recipe = root / "data.yaml"
    recipe.write_text(recipe_with_model("dcn_v2", root / "data"))
    made = run_cli("gen-data", "--recipe", str(recipe), "--out", str(root / "data"), "--rows",
                   "1024", "--eval-rows", "300", "--files", "2")
    assert made.returncode == 0, made.stderr
    return root


def _predict(run: Path, data: str, out: Path) -> np.ndarray:
    from embtrain.train.predict import PredictOptions, predict

    predict(PredictOptions(run, data, out, progress=False))
    return pq.read_table(out)["probability"].to_numpy()


def test_every_model_type_serves_without_embtrain(root: Path):
    from embtrain.serving.export import export_saved_model

    data = str(root / "data" / "eval" / "*.parquet")
    jobs, want = [], {}
    for model in MODELS:
        run = train_run(root, model, recipe_with_model(model, root / "data"))
        want[model] = _predict(run, data, root / f"pred-{model}.parquet")
        summary = export_saved_model(run, root / f"export-{model}")
        assert summary.path == str(root / f"export-{model}" / "8")
        jobs.append((Path(summary.path), data, root / f"tf-{model}.npy"))
    score_without_embtrain(jobs)
    for model in MODELS:
        got = np.load(root / f"tf-{model}.npy")
        assert got.shape == want[model].shape
        np.testing.assert_allclose(got, want[model], atol=1e-5, err_msg=model)


def test_two_rank_row_sharded_and_tiered_runs_serve_without_embtrain(root: Path):
    from embtrain.serving.export import export_saved_model

    data = str(root / "data" / "eval" / "*.parquet")
    sharded = train_run(root, "sharded", recipe_with_model("mlp", root / "data", **SHARDED), "--np", "2")
    plan = json.loads((sharded / "plan.json").read_text())
    assert "row" in json.dumps(plan)
    store = root / "store"
    store.mkdir()
    tiered_data = root / "data-tiered"
    (root / "tiered.yaml").write_text(TIERED.format(data=tiered_data, store=store))
    made = run_cli("gen-data", "--recipe", str(root / "tiered.yaml"), "--out", str(tiered_data),
                   "--rows", "1024", "--eval-rows", "300", "--files", "2")
    assert made.returncode == 0, made.stderr
    tiered = train_run(root, "tiered-run", TIERED.format(data=tiered_data, store=store))
    cases = {"sharded": (sharded, data), "tiered": (tiered, str(tiered_data / "eval/*.parquet"))}
    jobs, want = [], {}
    for name, (run, pattern) in cases.items():
        want[name] = _predict(run, pattern, root / f"pred-{name}.parquet")
        summary = export_saved_model(run, root / f"export-{name}")
        jobs.append((Path(summary.path), pattern, root / f"tf-{name}.npy"))
    score_without_embtrain(jobs)
    for name in cases:
        np.testing.assert_allclose(np.load(root / f"tf-{name}.npy"), want[name], atol=1e-5,
                                   err_msg=name)


def test_export_layout_versions_and_refusals(root: Path):
    run = root / "run-mlp"
    if not run.exists():
        train_run(root, "mlp", recipe_with_model("mlp", root / "data"))
    out = root / "versions"
    first = run_cli("export", str(run), str(out), "--checkpoint", "4", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["path"] == str(out / "4")
    second = run_cli("export", str(run), str(out))
    assert second.returncode == 0, second.stderr
    assert sorted(p.name for p in out.iterdir()) == ["4", "8"]  # a new version beside the old
    for version in ("4", "8"):
        assert (out / version / "saved_model.pb").is_file()
        assert (out / version / "variables").is_dir()
    again = run_cli("export", str(run), str(out))
    assert again.returncode == 2 and "already exported" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    big = run_cli("export", str(run), str(root / "too-big"), "--max-size", "1KiB")
    assert big.returncode == 2, big.stderr
    line = big.stderr.strip()
    assert len(line.splitlines()) == 1 and "export limit 1.0 KiB" in line and "bytes" in line
    assert not (root / "too-big").exists()
    missing = run_cli("export", str(root / "nope"), str(out))
    assert missing.returncode == 2 and "no such run directory" in missing.stderr
    show = subprocess.run([str(Path(sys.executable).parent / "saved_model_cli"), "show", "--dir",
                           str(out / "8"), "--all"], capture_output=True, text=True,
                          env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert show.returncode == 0, show.stderr
    for text in ("serving_default", "user_id", "hist_values", "hist_lengths", "city",
                 "probability", "logit"):
        assert text in show.stdout, text


def test_the_serving_guide_example_scores_a_parquet_file_with_tensorflow_alone(root: Path):
    """docs/SERVING.md's five lines, pointed at an export of the all-kinds recipe, equal
    predict."""
    run = root / "run-mlp"
    if not run.exists():
        train_run(root, "mlp", recipe_with_model("mlp", root / "data"))
    from embtrain.serving.export import export_saved_model

    summary = export_saved_model(run, root / "readme-export")
    first = sorted((root / "data" / "eval").glob("*.parquet"))[0]
    want = _predict(run, str(first), root / "readme-pred.parquet")
    readme = (REPO / "docs" / "SERVING.md").read_text()
    code = readme.split("## Scoring with TensorFlow alone\n\n```python\n")[1]
    code = code.split("```")[0]
    assert code.count("\n") == 5
    code = code.replace("models/ctr/1560", summary.path).replace(
        "data/quickstart/eval/part-00000.parquet", str(first))
    script = root / "readme_example.py"
    script.write_text("import sys\nsys.meta_path.insert(0, type('B', (), {'find_spec': "
                      "lambda self, n, *a: (_ for _ in ()).throw(ImportError(n)) "
                      "if n.split('.')[0] == 'embtrain' else None})())\n" + code +
                      f"\nimport numpy\nnumpy.save({str(root / 'readme.npy')!r}, p.numpy())\n")
    result = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True,
                            timeout=600, cwd="/", env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_allclose(np.load(root / "readme.npy"), want, atol=1e-5)


# ------------------------------------------------------------------ the graph's pieces


def test_tensorflow_xxh64_equals_the_training_hash():
    import tensorflow as tf

    from embtrain.data.kernels import hash_strings
    from embtrain.serving.tf_ops import xxh64

    rng = random.Random(7)
    alphabet = "abcxyzABC019 _-/\u00e9\u00fc\u6f22\u5b57\U0001f642\x00"
    strings = ["", "a", "abc", "v10"] + [
        "".join(rng.choice(alphabet) for _ in range(n))
        for n in [*range(0, 70), 95, 96, 97, 127, 128, 255, 256, 1000]]
    got = xxh64(tf.constant(strings)).numpy()
    np.testing.assert_array_equal(got, hash_strings(strings))
    assert got[0] == -1205034819632174695  # XXH64("") of the reference implementation
    assert xxh64(tf.constant([], tf.string)).numpy().shape == (0,)


@pytest.mark.parametrize("kind,param", [("uniform", 0.05), ("normal", 0.1),
                                        ("truncated_normal", 0.5), ("constant", 0.25),
                                        ("zeros", 0.0)])
def test_tensorflow_initializer_equals_the_engine(kind: str, param: float):
    import tensorflow as tf

    from embtrain.embedding.config import InitializerConfig, TableConfig
    from embtrain.embedding.initializers import initial_rows, table_base
    from embtrain.serving.tf_ops import initial_values

    args = {"uniform": {"scale": param}, "normal": {"std": param},
            "truncated_normal": {"std": param}, "constant": {"value": param}, "zeros": {}}[kind]
    table = TableConfig("t", 10, 6, initializer=InitializerConfig(kind, **args))
    keys = np.array([0, 3, -7, 2**62 + 11, -2**63, 2**63 - 1], np.int64)
    want = initial_rows(table, 5, keys)
    got = initial_values(tf.constant(keys), int(table_base(5, "t")), 6, kind, param).numpy()
    np.testing.assert_array_equal(got, want)


def _module(missing: str = "zeros"):
    """A serving module over small known tables, with a network that returns 0 logits."""
    import tensorflow as tf

    from embtrain.serving.graph import (
        DenseInput,
        FeatureInput,
        ServingModule,
        ServingSpec,
        TableSpec,
    )

    tables = (TableSpec("s", 2, 5), TableSpec("d", 2, None, missing, "uniform", 0.05, 12345))
    values = {"s": np.arange(10, dtype=np.float32).reshape(5, 2) + 1,
              "d": np.array([[100, 200], [300, 400]], np.float32)}
    keys = {"d": np.array([-9, 2**40], np.int64)}

    def feature(name: str, column: str, table: str, combiner: str = "sum", hotness=1,
                modulo: bool = False, is_list: bool = False, start: int = 0, width: int = 2,
                string: bool = False, weights: str | None = None) -> FeatureInput:
        return FeatureInput(name, column, table, is_list, string, "string" if string else "int64",
                            weights, combiner, hotness, modulo, 0, start, width)

    features = (feature("one", "one", "s"), feature("mod", "mod", "s", modulo=True, start=2),
                feature("str", "str", "s", modulo=True, string=True, start=4),
                feature("lst", "lst", "s", "mean", None, is_list=True, start=6, weights="w"),
                feature("cat", "cat", "s", "concat", 2, is_list=True, start=8, width=4),
                feature("dyn", "dyn", "d", "sqrtn", None, is_list=True, start=12))
    dense = (DenseInput("x", ("x",), ("float32",), 0.5, "log1p"),
             DenseInput("y", ("y",), ("float32",), None, "signed_log1p"))
    spec = ServingSpec(dense, features, tables, (14,), 2)
    seen = {}

    def network(d, groups):
        seen["dense"], seen["groups"] = d, groups
        return tf.reduce_sum(groups[0], axis=1) * 0.0 + tf.reduce_sum(d, axis=1) * 0.0

    return ServingModule(spec, values, keys, network, []), seen


def test_serving_outcomes_of_unseen_null_empty_and_out_of_range_ids():
    import tensorflow as tf

    from embtrain.data.kernels import hash_strings

    module, seen = _module()
    nan = float("nan")
    inputs = {
        "x": tf.constant([nan, 3.0, -1.0], tf.float32), "y": tf.constant([nan, -2.0, 0.0]),
        "one": tf.constant([1, 5, -1], tf.int64),  # in range, out of range above and below
        "mod": tf.constant([7, -1, 4], tf.int64),  # out_of_range: modulo, as in training
        "str": tf.constant(["v1", "", "\u00e9t\u00e9"]),
        "lst_values": tf.constant([0, 1, 9], tf.int64), "lst_lengths": tf.constant([2, 0, 1],
                                                                                   tf.int64),
        "w_values": tf.constant([1.0, 3.0, 2.0]), "w_lengths": tf.constant([2, 0, 1], tf.int64),
        "cat_values": tf.constant([2, 3, 4, 1], tf.int64),
        "cat_lengths": tf.constant([3, 0, 1], tf.int64),  # too long, empty, short
        "dyn_values": tf.constant([-9, 5, 2**40, 2**40], tf.int64),
        "dyn_lengths": tf.constant([2, 0, 2], tf.int64),
    }
    out = module.serve(inputs)  # traced, as a SavedModel runs it: no crash, finite
    assert np.isfinite(out["probability"].numpy()).all()
    module._serve(inputs)  # eagerly, to see the network's inputs
    np.testing.assert_allclose(out["probability"].numpy(), 0.5)
    s = np.arange(10, dtype=np.float32).reshape(5, 2) + 1
    g = seen["groups"][0].numpy()
    # null (NaN) dense values: fill_null, or 0 without one; then the transform
    np.testing.assert_allclose(seen["dense"].numpy(),
                               [[np.log1p(0.5), 0.0], [np.log1p(3.0), -np.log1p(2.0)],
                                [0.0, 0.0]], rtol=1e-6)
    # a static table without modulo: an id outside [0, rows) reads zeros
    np.testing.assert_array_equal(g[:, 0:2], [s[1], [0, 0], [0, 0]])
    np.testing.assert_array_equal(g[:, 2:4], [s[7 % 5], s[-1 % 5], s[4]])
    hashed = hash_strings(["v1", "", "\u00e9t\u00e9"]) % 5
    np.testing.assert_array_equal(g[:, 4:6], s[hashed])
    # mean with weights; an empty list pools to zeros; an out-of-range id in a list reads zeros
    np.testing.assert_allclose(g[:, 6:8], [(1 * s[0] + 3 * s[1]) / 4, [0, 0], [0, 0]],
                               rtol=1e-6)
    # concat: ids past the hotness are ignored, a short or empty list is padded with zeros
    np.testing.assert_array_equal(g[:, 8:12], [[*s[2], *s[3]], [0, 0, 0, 0], [*s[1], 0, 0]])
    # dynamic, missing: zeros — an unseen key reads zeros; sqrtn over the weights (1 each)
    np.testing.assert_allclose(g[:, 12:14], [[100 / np.sqrt(2), 200 / np.sqrt(2)], [0, 0],
                                             [600 / np.sqrt(2), 800 / np.sqrt(2)]], rtol=1e-6)


def test_serving_missing_initial_reads_the_initializer_value():
    import tensorflow as tf

    from embtrain.embedding.config import InitializerConfig, TableConfig
    from embtrain.embedding.initializers import initial_rows, table_base

    module, seen = _module("initial")
    base = int(table_base(3, "d"))
    assert base  # the module below was built with base 12345: compare against that
    inputs = {"x": tf.constant([1.0]), "y": tf.constant([1.0]), "one": tf.constant([0], tf.int64),
              "mod": tf.constant([0], tf.int64), "str": tf.constant(["a"]),
              "lst_values": tf.constant([], tf.int64), "lst_lengths": tf.constant([0], tf.int64),
              "w_values": tf.constant([], tf.float32), "w_lengths": tf.constant([0], tf.int64),
              "cat_values": tf.constant([], tf.int64), "cat_lengths": tf.constant([0], tf.int64),
              "dyn_values": tf.constant([77, -9], tf.int64),
              "dyn_lengths": tf.constant([2], tf.int64)}
    module._serve(inputs)  # eagerly, to see the network's inputs
    from embtrain.serving.tf_ops import initial_values

    unseen = initial_values(tf.constant([77], tf.int64), 12345, 2, "uniform", 0.05).numpy()[0]
    got = seen["groups"][0].numpy()[0, 12:14]
    np.testing.assert_allclose(got, (unseen + np.array([100, 200])) / np.sqrt(2), rtol=1e-6)
    # the TensorFlow initializer is the engine's (for the table's real base)
    table = TableConfig("d", 2, 2, initializer=InitializerConfig("uniform", scale=0.05))
    np.testing.assert_array_equal(
        initial_values(tf.constant([77], tf.int64), base, 2, "uniform", 0.05).numpy(),
        initial_rows(table, 3, np.array([77], np.int64)))
