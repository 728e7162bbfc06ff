"""``embtrain bench --baseline tfra``: the TensorFlow Recommenders-Addons baseline child.

The parts that need TFRA run only where ``bash scripts/bootstrap.sh --tfra`` made
``.venv-tfra`` (about 2.5 GB; CI does not make it); the rest always runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embtrain.bench import baseline_tfra
from embtrain.bench.footprint import baseline_table_bytes
from embtrain.bench.measure import PHASES
from embtrain.bench.runner import BASELINES, BenchOptions, plan_and_check, run_bench
from embtrain.bench.sides import TFRA_SCRIPT, TFRA_VENV_ENV, tfra_python, tfra_spec
from embtrain.bench.synthetic import LEARNING_RATES, load_model
from embtrain.bench.worker import SideSpec
from embtrain.cli.main import main
from embtrain.errors import UserInputError
from embtrain.plan import Topology

GiB = 2**30

REPO = Path(__file__).resolve().parents[1]


def _tfra() -> Path | None:
    try:
        return tfra_python()
    except UserInputError:
        return None


needs_tfra = pytest.mark.skipif(
    _tfra() is None, reason="no .venv-tfra: `bash scripts/bootstrap.sh --tfra` makes it")


def _spec(tmp_path: Path, **changes: object) -> SideSpec:
    fields = {"side": "tfra", "model": "tiny", "scale": 0.0002, "batch": 256,
              "optimizer": "adagrad", "steps": 2, "warmup": 1, "seed": 0,
              "batches_dir": str(tmp_path / "batches"), "out": str(tmp_path / "tfra.json")}
    fields.update(changes)
    return SideSpec(**fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------- without TFRA


def test_tfra_is_a_baseline() -> None:
    assert "tfra" in BASELINES


def test_missing_environment_is_one_line_naming_the_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(TFRA_VENV_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(UserInputError, match=r"bash scripts/bootstrap.sh --tfra"):
        tfra_python()
    code = main(["bench", "--model", "tiny", "--baseline", "tfra", "--scale", "0.0002",
                 "--batch", "256", "--steps", "1"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.endswith(f"make it with `bash scripts/bootstrap.sh --tfra` (or point "
                        f"{TFRA_VENV_ENV} at one)")
    assert str(tmp_path / "nowhere") in err


def test_unknown_baseline_lists_tfra(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--baseline", "torch"]) == 2
    assert "native-tf, tfra, fbgemm, one-process, static, none" in capsys.readouterr().err


def test_memory_check_counts_tfra_hash_tables() -> None:
    """TFRA's pre-sized hash tables hold the keys too: DE tiny with Adagrad measured 14.5 GiB
    after warm-up; the estimate must not be below it, and what does not fit is refused."""
    tiny = load_model("tiny")
    tfra = baseline_table_bytes(tiny, 1.0, "adagrad", "tfra")
    assert tfra > baseline_table_bytes(tiny, 1.0, "adagrad") and tfra > 12.5 * GiB
    top = Topology(world_size=1, device_memory=None, host_memory=24 * GiB, disk=100 * GiB)
    outcome, _, _ = plan_and_check(BenchOptions(model="tiny", baseline="tfra"), topology=top,
                                   available=14 * GiB)
    assert outcome.doc["ran"] is False
    assert "the tfra baseline needs about" in outcome.doc["reason"]
    assert "hash tables and optimizer slots" in outcome.doc["reason"]
    native, _, _ = plan_and_check(BenchOptions(model="tiny"), topology=top, available=14 * GiB)
    assert "ran" not in native.doc


def test_spec_resolves_the_model(tmp_path: Path) -> None:
    spec = tfra_spec(_spec(tmp_path, optimizer="adam"))
    model = load_model("tiny")
    assert [t["name"] for t in spec["tables"]] == [t.name for t in model.tables(0.0002)]
    assert [(i["table"], i["hotness"], i["dim"]) for i in spec["inputs"]] == [
        (i.table, i.hotness, i.dim) for i in model.inputs(0.0002)]
    assert spec["mlp"] == list(model.mlp) and spec["numerical"] == model.numerical
    assert spec["learning_rate"] == LEARNING_RATES["adam"]
    baseline_tfra.check_spec(spec)
    json.dumps(spec)  # it travels as JSON


@pytest.mark.parametrize(("change", "message"), [
    ({"optimizer": "ftrl"}, "optimizer 'ftrl' is not one of sgd, adagrad, adam"),
    ({"inputs": [{"name": "c0", "table": "nope", "hotness": 1, "dim": 8}]},
     "input c0 reads unknown table 'nope'"),
    ({"steps": 0}, "steps must be at least 1"),
    ({"tables": []}, "no tables or no inputs"),
])
def test_bad_spec_is_refused(tmp_path: Path, change: dict, message: str) -> None:
    spec = {**tfra_spec(_spec(tmp_path)), **change}
    with pytest.raises(ValueError, match=message):
        baseline_tfra.check_spec(spec)


def test_child_refuses_a_bad_spec_with_exit_2(tmp_path: Path) -> None:
    """The child's argument checks run before TensorFlow is imported (here: no TFRA needed)."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"side": "tfra"}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for args in ([], [str(bad)], [str(tmp_path / "missing.json")]):
        proc = subprocess.run([sys.executable, "-P", str(TFRA_SCRIPT), *args],
                              capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 2
        assert len(proc.stderr.strip().splitlines()) == 1
    assert "spec: missing batch" in proc.stderr or "No such file" in proc.stderr


def test_bootstrap_refuses_an_unknown_argument() -> None:
    proc = subprocess.run(["bash", str(REPO / "scripts/bootstrap.sh"), "--nope"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("bootstrap: unknown argument --nope; give none (one "
                                   "process), --horovod, --dev, --tfra or --fbgemm")


# ----------------------------------------------------------------------- with TFRA

ADAGRAD_CHECK = """
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
from baseline_tfra import TFRAModel
import tensorflow as tf
spec = {"seed": 0, "numerical": 2, "mlp": [8], "optimizer": "adagrad", "learning_rate": 0.1,
        "tables": [{"name": "t0", "rows": 100, "dim": 4}],
        "inputs": [{"name": "c0", "table": "t0", "hotness": 1, "dim": 4},
                   {"name": "c1", "table": "t0", "hotness": 3, "dim": 4}]}
m = TFRAModel(spec)
ids = [tf.constant([[-5], [2**40], [-5]], tf.int64),
       tf.constant([[7, 7, -5], [1, 2, 3], [9, 9, 2**62]], tf.int64)]
keys = tf.constant([-5, 2**40, 7, 1, 2, 3, 9, 2**62], tf.int64)
before = m.tables["t0"].lookup(keys).numpy()
assert m.live_keys() == {"t0": 0}
pooled = m.emb_step(ids, [tf.ones((3, 4)), 2 * tf.ones((3, 4))])
np.testing.assert_allclose(pooled[0].numpy()[0], before[0], rtol=1e-6)
np.testing.assert_allclose(pooled[1].numpy()[0], 2 * before[2] + before[0], rtol=1e-5)
after = m.tables["t0"].lookup(keys).numpy()
g = np.array([4, 1, 4, 2, 2, 2, 4, 2], float)[:, None]
np.testing.assert_allclose(after, before - 0.1 * g / np.sqrt(0.1 + g**2), atol=1e-6)
assert m.live_keys() == {"t0": 8}
print("ok")
"""


@needs_tfra
def test_tfra_tables_insert_and_update_like_adagrad() -> None:
    """Shared table, negative and 63-bit keys, duplicates: one step inserts every key and
    applies Adagrad (initial accumulator 0.1) to the summed gradient."""
    python = _tfra()
    assert python is not None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run([str(python), "-P", "-c", ADAGRAD_CHECK, str(TFRA_SCRIPT.parent)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


@needs_tfra
def test_bench_runs_tfra_side_by_side() -> None:
    outcome = run_bench(BenchOptions(model="tiny", scale=0.0002, batch=256, steps=2, warmup=1,
                                     baseline="tfra", batches=2))
    doc = outcome.doc
    assert doc["ran"] is True, doc.get("reason")
    assert list(doc["results"]) == ["embtrain", "tfra"]
    tfra = doc["results"]["tfra"]
    assert set(tfra["phases_ms"]) == set(PHASES)
    assert tfra["embedding_ms"]["median"] > 0 and tfra["step_ms"]["median"] > 0
    assert tfra["embedding_only_ms"]["median"] > 0
    assert np.isfinite(tfra["loss_first"]) and np.isfinite(tfra["loss_last"])
    assert doc["identical_batches"] is True
    assert tfra["versions"]["tfra"] == "0.8.1" and tfra["versions"]["tensorflow"] == "2.16.2"
    assert set(tfra["live_keys"]) == {t.name for t in load_model("tiny").tables(0.0002)}
    assert 0 < tfra["live_keys"]["t2"] <= load_model("tiny").tables(0.0002)[2].rows
    assert doc["ratios"]["embedding"] > 0 and "embedding_at_least_3x" in doc["targets"]
