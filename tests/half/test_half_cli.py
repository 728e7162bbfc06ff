"""The CLI paths of a half-precision run (bfloat16 tables, a static and a dynamic one, and
``mixed_precision: bf16``), through ``embtrain``'s own entry point:

* ``incremental-export`` keeps each table's dtype (uint16 patterns, the manifest names it), and
  base + increment equals the later dump byte for byte;
* ``load --allow dtype`` converts bfloat16 → float32 (exactly) and back (to the same patterns);
  without ``--allow dtype`` each table's change is named and refused, exit 2;
* ``export --format saved_model`` of the run (its network computing in bfloat16, as in
  training) scores, in a process with TensorFlow alone, what ``predict`` scores, within 1e-3.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from embtrain.embedding.reference_halves import widen_ref
from embtrain.kernels.codes import VAL_BF16
from tests.support.cli import REPO

RECIPE = """
version: 1
name: half
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 128}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
tables:
  - {{name: user, dim: 8, rows: 300{dtype}}}
  - {{name: item, dim: 8, dynamic: {{capacity: 4000}}{dtype}}}
optimizer: {{sparse: {{type: adagrad, lr: 0.05}}, dense: {{type: adam, lr: 0.003}}}}
model: {{type: dlrm, bottom: [16, 8], top: [16, 1]}}
train: {{steps: 12, eval_every: 12, log_every: 6, seed: 0, {precision}checkpoint: {{every: 6}}}}
"""


def _cli(*args: str) -> tuple[int, str]:
    """``embtrain ARGS`` in this process (the CLI's entry point: exit code, one-line errors)."""
    import contextlib
    import io

    from embtrain.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, err.getvalue()


def _write(root: Path, name: str, half: bool, bf16: bool | None = None) -> Path:
    """The recipe with bfloat16 tables (``half``) and a bf16 network (``bf16``, default:
    ``half``)."""
    path = root / f"{name}.yaml"
    bf16 = half if bf16 is None else bf16
    path.write_text(RECIPE.format(data=root / "data", dtype=", dtype: bfloat16" if half else "",
                                  precision="mixed_precision: bf16, " if bf16 else ""))
    return path


def _arrays(folder: Path) -> dict[str, np.ndarray]:
    return {str(p.relative_to(folder)): np.load(p) for p in sorted(folder.rglob("*.npy"))}


@pytest.fixture(scope="module")
def half_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("half-cli")
    code, err = _cli("gen-data", "--recipe", str(_write(root, "gen", False)), "--out",
                     str(root / "data"), "--rows", "1536", "--eval-rows", "256", "--files", "1")
    assert code == 0, err
    code, err = _cli("run", str(_write(root, "half", True)), "--run-dir", str(root / "run"))
    assert code == 0, err
    return root


def test_incremental_export_keeps_the_dtype(half_run: Path) -> None:
    root = half_run
    _final_dump(root)
    for args in (("dump", str(root / "run"), str(root / "base"), "--step", "6"),
                 ("incremental-export", str(root / "run"), str(root / "inc"), "--since", "6")):
        code, err = _cli(*args)
        assert code == 0, err
    manifest = json.loads((root / "inc" / "manifest.json").read_text())
    inc = _arrays(root / "inc")
    for table in ("user", "item"):
        assert manifest["tables"][table]["dtype"] == "bfloat16"
        values = inc[f"tables/{table}/values.npy"]
        assert values.dtype == np.uint16 and values.shape[0] > 0
    code, err = _cli("apply-increments", str(root / "base"), str(root / "inc"), "--out",
                     str(root / "merged"))
    assert code == 0, err
    merged, later = _arrays(root / "merged"), _arrays(root / "later")
    for key, want in later.items():
        if key.startswith("tables/"):
            assert merged[key].dtype == want.dtype and merged[key].tobytes() == want.tobytes(), key


def _untouched(before: dict, after: dict, table: str) -> tuple[np.ndarray, np.ndarray]:
    """Values of ``table``'s rows the loaded run's one step left alone: before, after."""
    base = f"tables/{table}/"
    kb, ka = before[base + "keys.npy"], after[base + "keys.npy"]
    pos = np.searchsorted(ka, kb)
    ok = (pos < ka.size) & (ka[np.minimum(pos, ka.size - 1)] == kb)
    pos, keep = pos[ok], np.flatnonzero(ok)
    same = after[base + "update_count.npy"][pos] == before[base + "update_count.npy"][keep]
    assert same.sum() > 50
    return before[base + "values.npy"][keep[same]], after[base + "values.npy"][pos[same]]


def _final_dump(root: Path) -> Path:
    """``root/later``: the dump of the half run's last step (made by the first test that needs
    it, so each test also runs alone)."""
    if not (root / "later").exists():
        assert _cli("dump", str(root / "run"), str(root / "later"))[0] == 0
    return root / "later"


def test_load_converts_between_float32_and_bfloat16(half_run: Path) -> None:
    root = half_run
    f32, half = _write(root, "f32", False, bf16=True), root / "half.yaml"
    _final_dump(root)
    code, err = _cli("load", str(root / "later"), "--recipe", str(f32), "--run-dir",
                     str(root / "refused"), "--max-steps", "1")
    assert code == 2, err
    for table in ("user", "item"):
        assert (f"table {table}: dtype bfloat16 in the export, float32 in the recipe (allow "
                "with --allow dtype") in err
    code, err = _cli("load", str(root / "later"), "--recipe", str(f32), "--allow", "dtype",
                     "--run-dir", str(root / "as-f32"), "--max-steps", "1")
    assert code == 0, err
    assert _cli("dump", str(root / "as-f32"), str(root / "f32-dump"))[0] == 0
    src, wide = _arrays(root / "later"), _arrays(root / "f32-dump")
    for table in ("user", "item"):
        b, a = _untouched(src, wide, table)
        assert a.dtype == np.float32 and np.array_equal(a, widen_ref(b, VAL_BF16))  # exact
    code, err = _cli("load", str(root / "f32-dump"), "--recipe", str(half), "--allow", "dtype",
                     "--run-dir", str(root / "as-half"), "--max-steps", "1")
    assert code == 0, err
    assert _cli("dump", str(root / "as-half"), str(root / "half-dump"))[0] == 0
    back = _arrays(root / "half-dump")
    for table in ("user", "item"):
        a, b = _untouched(wide, back, table)
        assert b.dtype == np.uint16 and np.array_equal(widen_ref(b, VAL_BF16), a)


def test_saved_model_of_a_bf16_run_scores_like_predict(half_run: Path) -> None:
    root = half_run
    data = str(root / "data" / "eval" / "*.parquet")
    code, err = _cli("predict", str(root / "run"), "--data", data, "--out",
                     str(root / "pred.parquet"))
    assert code == 0, err
    want = pq.read_table(root / "pred.parquet")["probability"].to_numpy()
    code, err = _cli("export", str(root / "run"), str(root / "export"), "--format",
                     "saved_model")
    assert code == 0, err
    out = root / "tf.npy"
    result = subprocess.run([sys.executable, "-I", str(REPO / "tests" / "workers" / "serving_client.py"),
                             str(root / "export" / "12"), data, str(out)], capture_output=True,
                            text=True, timeout=600, cwd="/", env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(out)
    assert got.shape == want.shape == (256,)
    np.testing.assert_allclose(got, want, atol=1e-3)


def test_resume_of_a_half_run_is_bit_exact(half_run: Path) -> None:
    """6 steps, then ``run --resume`` to 12: the tables (static and dynamic bfloat16) and the
    losses equal the uninterrupted run's bit for bit."""
    from embtrain.train.metrics_log import read_metrics

    root = half_run
    code, err = _cli("run", str(root / "half.yaml"), "--run-dir", str(root / "part"),
                     "--max-steps", "6")
    assert code == 0, err
    code, err = _cli("run", "--resume", str(root / "part"))
    assert code == 0, err

    def losses(run: Path) -> list[float]:
        return [r["loss"] for r in read_metrics(run) if r["kind"] == "train"]

    assert losses(root / "part") == losses(root / "run") and len(losses(root / "run")) == 2
    assert _cli("dump", str(root / "part"), str(root / "part-dump"))[0] == 0
    a, b = _arrays(_final_dump(root)), _arrays(root / "part-dump")
    tables = [k for k in a if k.startswith("tables/")]
    assert "tables/item/values.npy" in tables and sorted(tables) == sorted(
        k for k in b if k.startswith("tables/"))
    for key in tables:
        assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_serving_reads_a_half_tables_missing_key_as_the_engine_does(dtype: str) -> None:
    """``missing: initial`` of a dynamic half table: the engine reads an unseen key's initial
    value narrowed to nearest; the SavedModel's TensorFlow ops give the same bits."""
    import tensorflow as tf

    from embtrain.embedding import EmbeddingEngine
    from embtrain.embedding.config import (
        DynamicConfig,
        FeatureConfig,
        SparseInput,
        SparseOptimizerConfig,
        TableConfig,
    )
    from embtrain.embedding.initializers import table_base
    from embtrain.serving.tf_ops import initial_values, stored_values

    table = TableConfig("d", 16, 8, dtype=dtype, dynamic=DynamicConfig(missing="initial"))
    engine = EmbeddingEngine([table], [FeatureConfig("f", "d", "sum", 1)],
                             SparseOptimizerConfig("sgd", lr=0.1), seed=3)
    keys = np.random.default_rng(0).integers(-2**62, 2**62, 200)
    got = engine.forward({"f": SparseInput.one_hot(keys)}, training=False)[0]
    start = initial_values(tf.constant(keys), int(table_base(3, "d")), 8, "uniform", 0.05)
    want = stored_values(start, dtype).numpy()
    assert got.tobytes() == want.tobytes()
    assert not np.array_equal(start.numpy(), want)  # the rounding mattered


def test_tiered_half_run_and_its_predict(tmp_path: Path) -> None:
    """A bfloat16 table (bfloat16 state) behind a host cache over a disk tier, beside a float16
    table, through ``run`` and ``predict``: the tier file holds 16-bit rows, and predict
    reproduces the run's last evaluation."""
    from tests.support.serving import TIERED

    (tmp_path / "store").mkdir()
    text = TIERED.format(data=tmp_path / "data", store=tmp_path / "store").replace(
        "rows: 3000\n", "rows: 3000\n    dtype: bfloat16\n    optimizer_state: table\n").replace(
        "rows: 50}", "rows: 50, dtype: float16}")
    (tmp_path / "t.yaml").write_text(text)
    for args in (("gen-data", "--recipe", str(tmp_path / "t.yaml"), "--out",
                  str(tmp_path / "data"), "--rows", "1024", "--eval-rows", "300", "--files", "1"),
                 ("run", str(tmp_path / "t.yaml"), "--run-dir", str(tmp_path / "run")),
                 ("predict", str(tmp_path / "run"), "--data", str(tmp_path / "data/eval/*.parquet"),
                  "--out", str(tmp_path / "p.parquet"))):
        code, err = _cli(*args)
        assert code == 0, err
    from embtrain.storage.disk import _read_header

    head = _read_header(tmp_path / "store" / "item.tier")
    assert head["dtype"] == "bfloat16" and head["record_bytes"] == 8 + 8 + 2 * (8 + 8)
    last = json.loads((tmp_path / "run" / "summary.json").read_text())["evals"][-1]
    from embtrain.train.predict import PredictOptions, predict

    summary = predict(PredictOptions(tmp_path / "run", str(tmp_path / "data/eval/*.parquet"),
                                     tmp_path / "p2.parquet", progress=False))
    assert abs(summary.auc - last["auc"]) < 1e-6 and abs(summary.logloss - last["logloss"]) < 1e-6
