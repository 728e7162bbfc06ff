"""The end-to-end parts of tests/gpu/run.sh (a GPU machine with CuPy, numba-cuda and JAX or
TensorFlow: the dense backend is ``auto``, so JAX where TensorFlow does not import).

``quickstart``: recipes/quickstart.yaml (its 800k generated rows, or ``--rows``) trained with
``train.device: gpu`` and with ``train.device: cpu``: the eval AUCs agree within 1e-3;
``bench``: ``embtrain bench --model tiny`` (DE tiny, batch 65536, Adagrad) on one GPU, its
step time next to distributed-embeddings' published figure for the same model and batch:
24.433 ms per step on one GPU of a DGX-A100 (5.537 ms on 8; their README's table).

Each part writes OUTDIR/e2e-<part>.json (every figure, the device, the date) and exits 1
when a check fails. Usage: python tests/gpu/e2e.py quickstart|bench OUTDIR [--rows N]
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

# distributed-embeddings' README (NVIDIA-Merlin/distributed-embeddings), synthetic "tiny"
# model, batch 65536: ms per step on one DGX-A100 GPU, and on its 8 GPUs
DE_TINY_MS = 24.433
DE_TINY_MS_8_GPUS = 5.537
AUC_TOLERANCE = 1e-3


def embtrain(*args: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, "-m", "embtrain", *args], capture_output=True,
                         text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    sys.stderr.write(res.stderr[-3000:])
    if res.returncode != 0:
        raise SystemExit(f"embtrain {' '.join(args)}: exit {res.returncode}")
    return res


def quickstart(out: Path, rows: int) -> dict[str, float]:
    data = out / "data-quickstart"
    if not (data / "dataset.json").exists():
        embtrain("gen-data", "--recipe", "recipes/quickstart.yaml", "--out", str(data),
                 "--rows", str(rows))
    text = Path("recipes/quickstart.yaml").read_text()
    aucs = {}
    for device in ("gpu", "cpu"):
        recipe = out / f"quickstart-{device}.yaml"
        recipe.write_text(text.replace("  seed: 0\n", f"  seed: 0\n  device: {device}\n")
                          .replace("data/quickstart/", f"{data.resolve()}/"))
        run_dir = out / f"quickstart-{device}"
        embtrain("run", str(recipe), "--run-dir", str(run_dir), "--json")
        summary = json.loads((run_dir / "summary.json").read_text())
        aucs[device] = float(summary["evals"][-1]["auc"])
        aucs[f"{device}_seconds"] = float(summary["seconds"])
    return aucs


def bench_tiny(out: Path) -> dict[str, float]:
    path = out / "bench_tiny.json"
    # no baseline side: the figure to compare with is the published one (and the GPU
    # machine has no TensorFlow for the native-tf side)
    embtrain("bench", "--model", "tiny", "--batch", "65536", "--optimizer", "adagrad",
             "--device", "gpu", "--baseline", "none", "--json", "--out", str(path))
    return json.loads(path.read_text())


def main() -> int:
    part = sys.argv[1] if len(sys.argv) > 1 else ""
    if part not in ("quickstart", "bench"):
        raise SystemExit("usage: python tests/gpu/e2e.py quickstart|bench OUTDIR [--rows N]")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "gpu-results")
    rows = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 800_000
    out.mkdir(parents=True, exist_ok=True)
    from embtrain.kernels import default_backend
    from embtrain.models.backend import resolve_backend

    result: dict[str, object] = {"date": datetime.date.today().isoformat(),
                                 "backend": default_backend(),
                                 "dense_backend": resolve_backend("auto")}
    try:
        result["device"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        result["device"] = "unknown"
    ok = True
    if part == "quickstart":
        aucs = quickstart(out, rows)
        result["quickstart"] = aucs
        ok = abs(aucs["gpu"] - aucs["cpu"]) <= AUC_TOLERANCE
        result["quickstart_auc_within_1e-3"] = ok
    else:
        result["bench_tiny"] = bench_tiny(out)
        result["de_tiny_published_ms_per_step_1_a100"] = DE_TINY_MS
        result["de_tiny_published_ms_per_step_8_a100"] = DE_TINY_MS_8_GPUS
    (out / f"e2e-{part}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
