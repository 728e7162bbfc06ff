"""Running one side of `embtrain bench` (embtrain, a baseline) in its own child process, one
or several ranks, or the TFRA baseline in its own environment; each writes its report as
JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from embtrain.bench.peer_fbgemm import PEER_SIDES, run_peer_side
from embtrain.bench.synthetic import load_model
from embtrain.bench.worker import SideSpec
from embtrain.errors import EmbtrainError, UserInputError

# The tfra baseline's environment (`bash scripts/bootstrap.sh --tfra`) and child script.
TFRA_VENV_ENV = "EMBTRAIN_TFRA_VENV"
TFRA_SCRIPT = Path(__file__).with_name("baseline_tfra.py")


def tfra_python() -> Path:
    """The Python of the TFRA environment (``$EMBTRAIN_TFRA_VENV`` or ``.venv-tfra`` at the
    repository root); one line naming the command that makes it when it is missing."""
    venv = Path(os.environ.get(TFRA_VENV_ENV) or Path(__file__).resolve().parents[2] / ".venv-tfra")
    python = venv / "bin" / "python"
    if not python.exists():
        raise UserInputError(
            f"--baseline tfra: no TensorFlow Recommenders-Addons environment at {venv}; make it "
            f"with `bash scripts/bootstrap.sh --tfra` (or point {TFRA_VENV_ENV} at one)")
    return python


def tfra_spec(spec: SideSpec) -> dict[str, Any]:
    """What the tfra child needs, resolved here (it cannot read embtrain's model files)."""
    from embtrain.bench.synthetic import LEARNING_RATES

    model = load_model(spec.model)
    return {
        "side": spec.side,
        "batch": spec.batch,
        "optimizer": spec.optimizer,
        "steps": spec.steps,
        "warmup": spec.warmup,
        "seed": spec.seed,
        "batches_dir": spec.batches_dir,
        "out": spec.out,
        "tables": [{"name": t.name, "rows": t.rows, "dim": t.dim} for t in model.tables(spec.scale)],
        "inputs": [{"name": i.name, "table": i.table, "hotness": i.hotness, "dim": i.dim}
                   for i in model.inputs(spec.scale)],
        "numerical": model.numerical,
        "mlp": list(model.mlp),
        "learning_rate": LEARNING_RATES[spec.optimizer],
    }


def _run_tfra(spec: SideSpec, workdir: Path) -> dict[str, Any]:
    path = workdir / "tfra.spec.json"
    path.write_text(json.dumps(tfra_spec(spec)))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")}
    env.pop("PYTHONPATH", None)  # the child imports nothing of embtrain or its environment
    proc = subprocess.run([str(tfra_python()), "-P", str(TFRA_SCRIPT), str(path)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise EmbtrainError(f"bench: the tfra side failed (exit {proc.returncode}): {tail}")
    return json.loads(Path(spec.out).read_text())


def run_side(spec: SideSpec, workdir: Path) -> dict[str, Any]:
    if spec.side == "tfra":
        return _run_tfra(spec, workdir)
    if spec.side in PEER_SIDES:  # FBGEMM's and torch's, in .venv-fbgemm
        return run_peer_side(spec, tfra_spec(spec), workdir)
    path = workdir / f"{spec.side}.spec.json"
    path.write_text(spec.to_json())
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")}
    if spec.processes > 1:
        from embtrain.comm.launch import LaunchSpec, launch

        threads = max(1, (os.cpu_count() or 1) // spec.processes)
        code = launch([sys.executable, "-m", "embtrain.bench.worker", str(path)],
                      LaunchSpec(spec.processes),
                      {"EMBTRAIN_THREADS": str(threads), "NUMBA_NUM_THREADS": str(threads)})
        if code != 0:
            raise EmbtrainError(f"bench: the {spec.side} side on {spec.processes} ranks failed "
                                f"(exit {code})")
        return json.loads(Path(spec.out).read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "embtrain.bench.worker", str(path)],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise EmbtrainError(f"bench: the {spec.side} side failed (exit {proc.returncode}): {tail}")
    return json.loads(Path(spec.out).read_text())


