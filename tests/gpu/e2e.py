"""The end-to-end part of tests/gpu/run.sh (a GPU machine with TensorFlow, CuPy, numba-cuda).

1. quickstart (recipes/quickstart.yaml, its 800k generated rows) trained with
   ``train.device: gpu`` and with ``train.device: cpu``: the eval AUCs agree within 1e-3;
2. ``embtrain bench --model tiny`` (DE tiny, batch 65536, Adagrad) on one GPU, its step time
   next to the published distributed-embeddings figure: 17.6 ms/step on one A100-80GB.

Writes OUTDIR/e2e.json (every figure, the device, the date) and exits 1 when a check fails.
Usage: python tests/gpu/e2e.py OUTDIR
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

DE_TINY_MS = 17.6  # distributed-embeddings README, tiny model, 1x A100-80GB, batch 65536
AUC_TOLERANCE = 1e-3


def embtrain(*args: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, "-m", "embtrain", *args], capture_output=True,
                         text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    sys.stderr.write(res.stderr[-3000:])
    if res.returncode != 0:
        raise SystemExit(f"embtrain {' '.join(args)}: exit {res.returncode}")
    return res


def quickstart(out: Path) -> dict[str, float]:
    data = Path("data/quickstart")
    if not (data / "dataset.json").exists():
        embtrain("gen-data", "--recipe", "recipes/quickstart.yaml", "--out", str(data),
                 "--rows", "800000")
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
    embtrain("bench", "--model", "tiny", "--batch", "65536", "--optimizer", "adagrad",
             "--device", "gpu", "--json", "--out", str(path))
    return json.loads(path.read_text())


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    from embtrain.kernels import default_backend

    result: dict[str, object] = {"date": datetime.date.today().isoformat(),
                                 "backend": default_backend()}
    try:
        result["device"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        result["device"] = "unknown"
    aucs = quickstart(out)
    result["quickstart"] = aucs
    ok = abs(aucs["gpu"] - aucs["cpu"]) <= AUC_TOLERANCE
    result["quickstart_auc_within_1e-3"] = ok
    result["bench_tiny"] = bench_tiny(out)
    result["de_tiny_published_ms_per_step"] = DE_TINY_MS
    (out / "e2e.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
