"""``embtrain bench --baseline fbgemm``: the FBGEMM and torch.nn.EmbeddingBag peers.

The parts that need the peers run where ``bash scripts/bootstrap.sh --fbgemm`` made
``.venv-fbgemm`` (scripts/test.sh makes it; about 190 MB of downloads); without it they skip
and the rest runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embtrain.bench import baseline_fbgemm, baseline_tfra
from embtrain.bench.measure import PHASES
from embtrain.bench.peer_fbgemm import (
    FBGEMM_SCRIPT,
    FBGEMM_VENV_ENV,
    PEER_SIDES,
    fbgemm_python,
    peer_step,
    peer_summary,
    reference_step,
    small_case,
    verify_peers,
)
from embtrain.bench.runner import BASELINES, BenchOptions, run_bench
from embtrain.bench.sides import tfra_spec
from embtrain.bench.synthetic import load_model
from embtrain.bench.worker import SideSpec
from embtrain.cli.main import main
from embtrain.errors import UserInputError


def _peers() -> Path | None:
    try:
        return fbgemm_python()
    except UserInputError:
        return None


needs_peers = pytest.mark.skipif(
    _peers() is None, reason="no .venv-fbgemm: `bash scripts/bootstrap.sh --fbgemm` makes it")


def _resolved(tmp_path: Path, kernel: str = "fbgemm", **changes: object) -> dict:
    spec = SideSpec(side=kernel, model="tiny", scale=0.0002, batch=256, optimizer="adagrad",
                    steps=2, warmup=1, seed=0, batches_dir=str(tmp_path / "batches"),
                    out=str(tmp_path / f"{kernel}.json"))
    return {**tfra_spec(spec), "kernel": kernel, **changes}


# ---------------------------------------------------------------- without the peers


def test_fbgemm_is_a_baseline_with_the_bench_phases() -> None:
    assert "fbgemm" in BASELINES and "torch" not in BASELINES
    assert PEER_SIDES == ("fbgemm", "torch")


def test_missing_environment_is_one_line_naming_the_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    half_made = tmp_path / "half"
    (half_made / "bin").mkdir(parents=True)
    (half_made / "bin" / "python").symlink_to(sys.executable)  # no stamp: bootstrap stopped
    for venv in (tmp_path / "nowhere", half_made):
        monkeypatch.setenv(FBGEMM_VENV_ENV, str(venv))
        with pytest.raises(UserInputError, match=r"bash scripts/bootstrap.sh --fbgemm"):
            fbgemm_python()
        code = main(["bench", "--model", "tiny", "--baseline", "fbgemm", "--scale", "0.0002",
                     "--batch", "256", "--steps", "1"])
        assert code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert str(venv) in err and "bootstrap.sh --fbgemm" in err


@needs_peers
def test_an_optimizer_the_peers_do_not_run_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--model", "tiny", "--baseline", "fbgemm", "--optimizer", "adam",
                 "--scale", "0.0002", "--batch", "256", "--steps", "1"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--optimizer adam" in err and "adagrad" in err


@pytest.mark.parametrize(("change", "message"), [
    ({"kernel": "jax"}, "kernel 'jax' is not one of fbgemm, torch"),
    ({"optimizer": "adam"}, "optimizer 'adam': the fbgemm baseline runs adagrad"),
    ({"inputs": [{"name": "c0", "table": "nope", "hotness": 1, "dim": 8}]},
     "input c0 reads unknown table 'nope'"),
    ({"steps": 0}, "steps must be at least 1"),
])
def test_bad_spec_is_refused(tmp_path: Path, change: dict, message: str) -> None:
    baseline_fbgemm.check_spec(_resolved(tmp_path))
    with pytest.raises(ValueError, match=message):
        baseline_fbgemm.check_spec(_resolved(tmp_path, **change))
    without = _resolved(tmp_path)
    del without["kernel"]
    with pytest.raises(ValueError, match="spec: missing kernel"):
        baseline_fbgemm.check_spec(without)


def test_child_refuses_a_bad_spec_with_exit_2(tmp_path: Path) -> None:
    """The child's argument checks run before torch is imported (here: no torch needed)."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_resolved(tmp_path), "kernel": "jax"}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for args, said in (([], "usage"), ([str(bad)], "kernel 'jax'"),
                       ([str(tmp_path / "missing.json")], "No such file")):
        proc = subprocess.run([sys.executable, "-P", str(FBGEMM_SCRIPT), *args],
                              capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 2
        assert len(proc.stderr.strip().splitlines()) == 1 and said in proc.stderr


def test_child_measures_as_the_tfra_child() -> None:
    assert baseline_fbgemm.INIT_SCALE == baseline_tfra.INIT_SCALE


def test_reference_step_pools_and_applies_adagrad_to_summed_gradients() -> None:
    """A shared table read at hotness 1 and 2 with a repeated id: the pooled sums and one
    Adagrad step (accumulator from 0.1) on each row's summed gradient, written out by hand."""
    w = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
    ids = [np.array([[1], [4]]), np.array([[1, 1], [0, 4]])]
    up = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)
    pooled, (after,) = reference_step([w], [0, 0], ids, up, lr=0.5)
    np.testing.assert_allclose(pooled, [[w[1][0], w[1][1], 2 * w[1][0], 2 * w[1][1]],
                                        [w[4][0], w[4][1], w[0][0] + w[4][0], w[0][1] + w[4][1]]])
    g = {1: np.array([1 + 3 + 3, 2 + 4 + 4]), 4: np.array([5 + 7, 6 + 8]), 0: np.array([7, 8])}
    expected = w.astype(np.float64).copy()
    for row, grad in g.items():
        expected[row] -= 0.5 * grad / (np.sqrt(0.1 + grad**2) + 1e-7)
    np.testing.assert_allclose(after, expected, rtol=1e-6)
    assert np.array_equal(after[[2, 3, 5]], w[[2, 3, 5]])


def test_peer_summary_is_the_median_of_round_ratios() -> None:
    rounds = {"embtrain": [{"step": 10.0, "embedding": 5.0, "dense": 1.0},
                           {"step": 20.0, "embedding": 4.0, "dense": 1.0},
                           {"step": 10.0, "embedding": 2.0, "dense": 1.0}],
              "fbgemm": [{"step": 30.0, "embedding": 15.0, "dense": 1.0},
                         {"step": 30.0, "embedding": 8.0, "dense": 1.0},
                         {"step": 50.0, "embedding": 8.0, "dense": 1.0}]}
    out = peer_summary({"embtrain": {}, "fbgemm": {}}, rounds)
    assert list(out) == ["fbgemm"]
    assert out["fbgemm"]["embedding"]["ratio_by_round"] == [3.0, 2.0, 4.0]
    assert out["fbgemm"]["embedding"]["ratio_median"] == 3.0
    assert out["fbgemm"]["step"]["ratio_median"] == 3.0
    assert out["fbgemm"]["step"]["fbgemm_ms"] == [30.0, 30.0, 50.0]


# ------------------------------------------------------------------- with the peers


@needs_peers
@pytest.mark.parametrize("seed", [1, 2])
def test_peers_compute_embtrains_step(seed: int) -> None:
    """Fresh random weights, skewed ids, a shared table, three widths: FBGEMM's and torch's
    pooled outputs and updated rows equal the plain reference (float32 rounding)."""
    errors = verify_peers(seed)
    assert set(errors) == set(PEER_SIDES)
    for e in errors.values():
        assert e["pooled"] <= 1e-6 and e["updated"] <= 1e-6


@needs_peers
def test_the_check_sees_a_different_learning_rate() -> None:
    """The comparison is sharp enough to see a peer doing something else."""
    case = small_case(3)
    weights = [case[f"w_{t}"] for t in range(3)]
    ids = [case[f"ids_{i}"] for i in range(4)]
    _pooled, after = reference_step(weights, case["input_tables"].tolist(), ids,
                                    case["upstream"], 0.9 * float(case["learning_rate"]))
    for kernel in PEER_SIDES:
        out = peer_step(kernel, case)
        assert max(float(np.abs(out[f"w_{t}"] - after[t]).max()) for t in range(3)) > 1e-4


@needs_peers
def test_bench_runs_fbgemm_and_torch_side_by_side() -> None:
    outcome = run_bench(BenchOptions(model="tiny", scale=0.0002, batch=256, steps=2, warmup=1,
                                     baseline="fbgemm", batches=2, repeat=2))
    doc = outcome.doc
    assert doc["ran"] is True, doc.get("reason")
    assert list(doc["results"]) == ["embtrain", "fbgemm", "torch"]
    assert doc["identical_batches"] is True
    assert set(doc["peer_check"]) == {"fbgemm", "torch"}
    for side in PEER_SIDES:
        r = doc["results"][side]
        assert set(r["phases_ms"]) == set(PHASES)
        assert r["embedding_ms"]["median"] > 0 and r["step_ms"]["median"] > 0
        assert np.isfinite(r["loss_first"]) and np.isfinite(r["loss_last"])
        # the labels say what the peer's step runs, not TensorFlow's
        assert r["fused_runs"].startswith("one eager PyTorch step")
        assert "tf.function" not in r["step_source"] + r["embedding_source"]
        assert r["versions"]["torch"].startswith("2.13.0")
        assert len(doc["peers"][side]["embedding"]["ratio_by_round"]) == 2
        assert doc["peers"][side]["embedding"]["ratio_median"] > 0
    assert doc["results"]["fbgemm"]["versions"]["fbgemm_gpu"] == "1.8.0"
    assert "FBGEMM" in doc["results"]["fbgemm"]["fused_runs"]
    assert doc["ratios"]["embedding"] > 0 and "embedding_at_least_3x" in doc["targets"]
    assert len(load_model("tiny").inputs(0.0002)) == 58
