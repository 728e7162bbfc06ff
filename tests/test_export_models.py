"""`embtrain export` of every model `run` trains: several labels (built-in and Keras) with one
output per label, scored without embtrain like `predict`; and the checkpoint checks, the
refusals and the clean-up export shares with predict, dump and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, run_cli
from tests.test_export import _recipe, _tf_only, _train

TWO_LABELS = "labels: {click: {column: label}, conversion: {column: conversion}}"
THREE_LABELS = ("labels: {click: {column: label}, conversion: {column: conversion, weight: 0.5},"
                " dwell: {column: dwell, loss: mse}}")
KERAS_MMOE = ("{type: keras, build: 'keras_mmoe_model:build', path: '%s', "
              "options: {experts: 2, expert: [8], tower: [4]}}" % (REPO / "recipes"))


def _labelled(model: str, data: Path, labels: str, model_yaml: str | None = None) -> str:
    text = _recipe(model, data)
    text = text.replace("batch_size: 128}", f"batch_size: 128, {labels}}}")
    assert labels in text
    if model_yaml is not None:
        text = text.replace("{type: mlp, hidden: [8]}", model_yaml)
        assert model_yaml in text
    return text


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The all-kinds rows plus a second bce label (conversion) and an mse label (dwell)."""
    root = tmp_path_factory.mktemp("export-labels")
    recipe = root / "data.yaml"
    recipe.write_text(_recipe("mlp", root / "data"))
    made = run_cli("gen-data", "--recipe", str(recipe), "--out", str(root / "data"), "--rows",
                   "1024", "--eval-rows", "300", "--files", "2")
    assert made.returncode == 0, made.stderr
    rng = np.random.default_rng(7)
    for path in sorted((root / "data").glob("*/*.parquet")):
        t = pq.read_table(path)
        y = t.column("label").to_numpy()
        conversion = ((y == 1) & (rng.random(len(y)) < 0.5)).astype(np.int8)
        dwell = (rng.random(len(y)) * 3 + y).astype(np.float32)
        t = t.append_column("conversion", pa.array(conversion))
        pq.write_table(t.append_column("dwell", pa.array(dwell)), path)
    return root


def _predict_columns(run: Path, data: str, out: Path) -> dict[str, np.ndarray]:
    from embtrain.train.predict import PredictOptions, predict

    predict(PredictOptions(run, data, out, progress=False))
    table = pq.read_table(out)
    return {name: table[name].to_numpy() for name in table.column_names}


def test_several_labels_export_one_output_per_label_scoring_like_predict(root: Path):
    """A two-label dlrm, a three-label mmoe (an mse label among them) and a two-label Keras
    MMoE: the SavedModel, loaded where embtrain cannot be imported, returns predict's columns
    to 1e-5."""
    from embtrain.serving.export import export_saved_model

    data = str(root / "data" / "eval" / "*.parquet")
    cases = {
        "dlrm2": _labelled("dlrm", root / "data", TWO_LABELS),
        "mmoe3": _labelled("mlp", root / "data", THREE_LABELS,
                           "{type: mmoe, experts: 3, expert: [8], tower: [4]}"),
        "keras2": _labelled("mlp", root / "data", TWO_LABELS, KERAS_MMOE),
    }
    jobs, want, outputs = [], {}, {}
    for name, text in cases.items():
        run = _train(root, name, text)
        want[name] = _predict_columns(run, data, root / f"pred-{name}.parquet")
        summary = export_saved_model(run, root / f"export-{name}")
        outputs[name] = summary.outputs
        jobs.append((Path(summary.path), data, root / f"tf-{name}.npz"))
    assert outputs["dlrm2"] == ["click_probability", "click_logit", "conversion_probability",
                                "conversion_logit"]
    assert outputs["keras2"] == outputs["dlrm2"]
    assert outputs["mmoe3"] == [*outputs["dlrm2"], "dwell_prediction"]
    _tf_only(jobs)
    for name in cases:
        got = dict(np.load(root / f"tf-{name}.npz"))
        assert sorted(got) == sorted(outputs[name])
        for column in outputs[name]:
            assert got[column].shape == want[name][column].shape, (name, column)
            np.testing.assert_allclose(got[column], want[name][column], atol=1e-5,
                                       err_msg=f"{name}: {column}")
        # the heads differ: each output is its own label's
        assert not np.allclose(got["click_probability"], got["conversion_probability"])


@pytest.fixture(scope="module")
def mlp_run(root: Path) -> Path:
    return _train(root, "plain", _recipe("mlp", root / "data"))


def _copy_run(run: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run, to)
    return to


def test_export_refuses_a_run_whose_recipe_was_edited(root: Path, mlp_run: Path):
    run = _copy_run(mlp_run, root / "edited")
    recipe = run / "recipe.yaml"
    text = recipe.read_text()
    assert "combiner: mean" in text
    recipe.write_text(text.replace("combiner: mean", "combiner: sum", 1))
    result = run_cli("export", str(run), str(root / "edited-out"))
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "recipe.yaml is now" in line and "edited after training" in line
    assert not (root / "edited-out").exists()


def _rewrite_member(checkpoint: Path, rel: str, array: np.ndarray, fingerprint: bool) -> None:
    """Replace one array of a checkpoint and make its manifest entry agree (the checksum and
    shape; and the content fingerprint when ``fingerprint``): a consistent lie."""
    from embtrain.checkpoint.bundle_format import FileEntry, content_fingerprint, hash_file

    np.save(checkpoint / rel, array)
    manifest_path = checkpoint / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["files"]:
        if entry["path"] == rel:
            entry.update(sha256=hash_file(checkpoint / rel), bytes=(checkpoint / rel).stat().st_size,
                         dtype=array.dtype.name, shape=list(array.shape))
            entry.pop("crc32", None)
    if fingerprint:
        entries = [FileEntry(e["path"], e["sha256"], e["bytes"], e.get("dtype"),
                             None if e.get("shape") is None else tuple(e["shape"]), e.get("crc32"))
                   for e in manifest["files"]]
        manifest["content_fingerprint"] = content_fingerprint(entries)
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("case", ["nan-table", "nan-dense", "lying-shape", "stale-fingerprint"])
def test_export_verifies_the_checkpoint_content(root: Path, mlp_run: Path, case: str):
    run = _copy_run(mlp_run, root / f"bad-{case}")
    checkpoint = sorted((run / "checkpoints").glob("step-*"))[-1]
    values = np.load(checkpoint / "tables/user/values.npy")
    if case in ("nan-table", "stale-fingerprint"):
        _rewrite_member(checkpoint, "tables/user/values.npy", np.full_like(values, np.nan),
                        fingerprint=case == "nan-table")
        expect = ("table user: holds non-finite values" if case == "nan-table"
                  else "content fingerprint does not match")
    elif case == "nan-dense":
        w = np.load(checkpoint / "dense/weights-000.npy")
        _rewrite_member(checkpoint, "dense/weights-000.npy", np.full_like(w, np.nan), True)
        expect = "dense weight 0 holds non-finite values"
    else:  # the same bytes seen as rows of twice the width: the reshape would misread them
        _rewrite_member(checkpoint, "tables/user/values.npy",
                        values.reshape(values.shape[0] // 2, -1).copy(), True)
        expect = "this recipe's table needs [n] and [n, 4]"
    result = run_cli("export", str(run), str(root / f"bad-{case}-out"))
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and expect in line, line
    assert not (root / f"bad-{case}-out" / "8").exists()


def test_export_into_a_read_only_file_system_is_one_line(root: Path, mlp_run: Path):
    """As `dump` and a read-only `--resume`: the cause in one line, exit 1 (the environment),
    not `internal error: PermissionDeniedError`; nothing is left behind."""
    ro = root / "read-only"
    ro.mkdir()
    (ro / "models").mkdir()  # OUT exists: TensorFlow's own write fails
    if os.geteuid() != 0:
        for path in (ro / "models", ro):
            path.chmod(0o555)
    elif subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(ro)],
                        capture_output=True).returncode != 0:
        pytest.skip("root, but cannot mount a tmpfs here")
    else:
        (ro / "models").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
    try:
        results = [run_cli("export", str(mlp_run), str(ro / "models")),
                   run_cli("export", str(mlp_run), str(ro / "new" / "models"))]  # OUT is made
        left = sorted(p.name for p in (ro / "models").iterdir())
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=True)
        else:
            for path in (ro, ro / "models"):
                path.chmod(0o755)
    for r in results:
        assert r.returncode == 1, r.stderr
        line = r.stderr.strip()
        assert len(line.splitlines()) == 1 and "cannot write the export" in line, line
        assert "internal error" not in line and ("read-only" in line.lower()
                                                 or "permission" in line.lower()), line
    assert left == []


def test_a_killed_exports_temporary_is_removed_by_the_next_and_sigterm_cleans_up(
        root: Path, mlp_run: Path):
    out = root / "killed"
    out.mkdir()
    # what a kill -9 leaves: an owned temporary of a process that no longer exists
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    stale = out / f".tmp-8-{dead.pid}-abcdef@{socket.gethostname()}"
    (stale / "variables").mkdir(parents=True)
    result = run_cli("export", str(mlp_run), str(out))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["8"]
    # SIGTERM while the export runs: one line, exit 143, no temporary left
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    term_out = root / "terminated"
    proc = subprocess.Popen([sys.executable, "-m", "embtrain", "export", str(mlp_run),
                             str(term_out)], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
            term_out.is_dir() and any(p.name.startswith(".tmp-") for p in term_out.iterdir())):
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.fail("the export finished before SIGTERM reached it")
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "export stopped by SIGTERM" in err and len(err.strip().splitlines()) == 1, err
    assert list(term_out.iterdir()) == []


NULL_RULES = {
    "column: user_id, table: user}": "column: user_id, table: user, null: skip}",
    "ids: string, out_of_range: modulo}": "ids: string, out_of_range: modulo, "
                                          "null: {id: unknown}}",
    "hotness: 3, combiner: concat}": "hotness: 3, combiner: concat, null: skip}",
    "table: item, weights: item_w}": "table: item, weights: item_w, null: {id: 3}}",
    "combiner: sqrtn}": "combiner: sqrtn, null: {id: 5}}",
}


def _with_nulls(table: pa.Table, rng: np.random.Generator) -> pa.Table:
    """Null ids in every categorical column the rules above cover: one-hot ids, list elements
    and whole lists (about a quarter of each)."""
    def scalar(name: str) -> None:
        nonlocal table
        column = table.column(name).combine_chunks()
        mask = pa.array(rng.random(len(column)) < 0.25)
        table = table.set_column(table.column_names.index(name), name,
                                 pa.compute.if_else(mask, pa.scalar(None, column.type), column))

    def lists(name: str) -> None:
        nonlocal table
        rows = table.column(name).to_pylist()
        out = []
        for row in rows:
            u = rng.random()
            if u < 0.2:
                out.append(None)  # a null list
            elif u < 0.5 and row:
                row = list(row)
                row[int(rng.integers(len(row)))] = None  # a null element
                out.append(row)
            else:
                out.append(row)
        typ = table.schema.field(name).type
        table = table.set_column(table.column_names.index(name), name, pa.array(out, typ))

    import pyarrow.compute  # noqa: F401

    for name in ("user_id", "city", "item_id"):
        scalar(name)
    for name in ("tags", "dyn_id"):
        lists(name)
    return table


def test_null_ids_reach_the_saved_model_and_follow_the_recipes_null_rule(root: Path):
    """A row with null ids (one-hot, list elements, whole lists; skip and id rules, string and
    integer ids, with weights) scores like predict: the signature's `<column>_null` and
    `<column>_values_null` inputs say which are missing."""
    from embtrain.serving.export import export_saved_model

    text = _recipe("mlp", root / "data")
    for old, new in NULL_RULES.items():
        assert old in text, old
        text = text.replace(old, new)
    run = _train(root, "nulls", text)
    rng = np.random.default_rng(3)
    nulls = root / "eval-nulls"
    nulls.mkdir()
    for i, path in enumerate(sorted((root / "data" / "eval").glob("*.parquet"))):
        pq.write_table(_with_nulls(pq.read_table(path), rng), nulls / f"part-{i:05d}.parquet")
    data = str(nulls / "*.parquet")
    want = _predict_columns(run, data, root / "pred-nulls.parquet")["probability"]
    summary = export_saved_model(run, root / "export-nulls")
    for name in ("user_id_null", "city_null", "item_id_null", "tags_null", "tags_values_null",
                 "dyn_id_null", "dyn_id_values_null"):
        assert summary.inputs[name] == "bool[None]", name
    assert "hist_null" not in summary.inputs  # null: error (the default) takes no null input
    jobs = [(Path(summary.path), data, root / "tf-nulls.npy")]
    _tf_only(jobs)
    got = np.load(root / "tf-nulls.npy")
    np.testing.assert_allclose(got, want, atol=1e-5)
