"""``load --allow dtype`` into a float16 table checks that the export's values fit float16's
range (a value beyond 65504 would load as inf); bfloat16 has float32's range."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import numpy as np

from embtrain.checkpoint.half_range import FLOAT16_MAX, as_float32
from tests.support.checkpoints import rewrite_member

RECIPE = """
version: 1
name: big
data: {{train: {data}/train/*.parquet, batch_size: 128}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
tables:
  - {{name: user, dim: 4, rows: 300{dtype}}}
  - {{name: item, dim: 4, rows: 1000{dtype}}}
optimizer: {{sparse: {{type: sgd, lr: 0.001}}, dense: {{type: adam, lr: 0.003}}}}
model: {{type: dlrm, bottom: [8, 4], top: [8, 1]}}
train: {{steps: 2, log_every: 1, seed: 0}}
"""


def _cli(*args: str) -> tuple[int, str, str]:
    from embtrain.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_load_check_refuses_values_beyond_float16s_range(tmp_path: Path) -> None:
    def recipe(name: str, dtype: str) -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(RECIPE.format(data=tmp_path / "data",
                                      dtype=f", dtype: {dtype}" if dtype else ""))
        return str(path)

    assert _cli("gen-data", "--recipe", recipe("f32", ""), "--out", str(tmp_path / "data"),
                "--rows", "512", "--eval-rows", "128", "--files", "1")[0] == 0
    code, _, err = _cli("run", str(tmp_path / "f32.yaml"), "--run-dir", str(tmp_path / "run"))
    assert code == 0, err
    small, big = tmp_path / "small-dump", tmp_path / "big-dump"
    assert _cli("dump", str(tmp_path / "run"), str(small))[0] == 0
    shutil.copytree(small, big)
    # one value of the user table beyond float16's range (a consistent dump: checksums agree)
    values = np.load(big / "tables" / "user" / "values.npy")
    assert np.abs(values).max() < FLOAT16_MAX
    values[7, 2] = -70000.5
    rewrite_member(big, "tables/user/values.npy", values, fingerprint=True)

    code, out, err = _cli("load", str(big), "--recipe", recipe("f16", "float16"), "--allow",
                          "dtype", "--check")
    assert code == 2, out
    assert err.strip().splitlines() == [
        f"{big}: table user: values up to 70000.5 in the export, beyond float16's range "
        "(largest 65504): they would load as inf; keep the table float32 or make it bfloat16 "
        "(float32's range)"]
    # the load itself refuses the same, before training
    code, _, err = _cli("load", str(big), "--recipe", str(tmp_path / "f16.yaml"), "--allow",
                        "dtype", "--run-dir", str(tmp_path / "f16-run"))
    assert code == 2 and "beyond float16's range" in err, err
    # values within the range fit, and bfloat16 takes float32's range
    for dump, dtype in ((small, "float16"), (big, "bfloat16")):
        code, out, err = _cli("load", str(dump), "--recipe", recipe(f"to-{dtype}", dtype),
                              "--allow", "dtype", "--check")
        assert code == 0, err
        assert "fits" in out


def test_half_patterns_widen_to_their_float32_values() -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(scale=1000, size=257).astype(np.float32)
    f16 = x.astype(np.float16)
    assert np.array_equal(as_float32(f16.view(np.uint16), "float16"), f16.astype(np.float32))
    import ml_dtypes

    bf16 = x.astype(ml_dtypes.bfloat16)
    assert np.array_equal(as_float32(bf16.view(np.uint16), "bfloat16"), bf16.astype(np.float32))
    assert np.array_equal(as_float32(x, "float32"), x)
