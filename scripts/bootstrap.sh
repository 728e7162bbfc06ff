#!/usr/bin/env bash
# Create or reuse the project's virtual environment in .venv (idempotent).
#
# A fresh machine needs only Python 3.11, gcc, cmake and git. The first run
# installs tensorflow-cpu 2.18.1, builds horovod 0.28.1 with Gloo (about two
# minutes), and installs embtrain in editable mode with its test tools. A
# later run compares a stamp of the requirements and installs nothing.
# Last, the numba kernels are compiled into the per-user cache
# (~/.cache/embtrain/numba/<hash of the kernel sources>; see
# embtrain/kernels/numba_cache.py) unless that kernel code was compiled before,
# so `embtrain run` starts training at once.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${EMBTRAIN_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

TF_VERSION=2.18.1
HOROVOD_VERSION=0.28.1
STAMP_INPUT="tf=$TF_VERSION hvd=$HOROVOD_VERSION $(sha256sum pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)"
STAMP="$VENV/.embtrain-stamp"

warm_kernels() {
  "$VENV/bin/python" -m embtrain.kernels.warm --if-needed
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_INPUT" ] && "$VENV/bin/python" -c "import embtrain" 2>/dev/null; then
  warm_kernels
  exit 0
fi

echo "bootstrap: setting up $VENV (first run takes a few minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip setuptools wheel
# TensorFlow first: horovod's build needs it importable. numpy is capped by TF 2.18.
"${PIP[@]}" install "tensorflow-cpu==$TF_VERSION" "numpy>=1.26,<2.1"
if ! "$VENV/bin/python" -c "import horovod.tensorflow" 2>/dev/null; then
  echo "bootstrap: building horovod $HOROVOD_VERSION with Gloo (about 2 minutes)" >&2
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
    "${PIP[@]}" install --no-build-isolation --no-cache-dir "horovod==$HOROVOD_VERSION"
fi
"${PIP[@]}" install -e ".[dev]" "numpy>=1.26,<2.1"
echo "$STAMP_INPUT" > "$STAMP"
warm_kernels
echo "bootstrap: done" >&2
