#!/usr/bin/env bash
# Create or reuse the project's virtual environment in .venv (idempotent).
#
#   bash scripts/bootstrap.sh            what one process needs (scripts/quickstart.sh)
#   bash scripts/bootstrap.sh --horovod  that, and Horovod: jobs of several processes
#   bash scripts/bootstrap.sh --dev      that, Horovod and the test and docs tools
#                                        (pytest, ruff, mkdocs: scripts/test.sh)
#   bash scripts/bootstrap.sh --tfra     only .venv-tfra, for `embtrain bench --baseline tfra`
#   bash scripts/bootstrap.sh --fbgemm   only .venv-fbgemm, for `embtrain bench --baseline fbgemm`
#
# A fresh machine needs only Python 3.11 (and, for Horovod, gcc, cmake and git). The first run
# installs tensorflow-cpu 2.18.1 and embtrain in editable mode, in one pip call; --horovod
# builds horovod 0.28.1 with Gloo from source (2-4 minutes on 2 cores), which a job of one
# process never imports, so the quickstart's set-up leaves it out (`embtrain run --np 2`
# without it: one line naming this command, exit 2). A later run compares a stamp of the
# requirements and installs nothing.
# Last, the numba kernels the shipped recipes need (float32 tables; the default
# set of embtrain/cli/warm.py) are compiled into the per-user cache
# (~/.cache/embtrain/numba/<hash of the kernel sources>; see
# embtrain/kernels/numba_cache.py) unless that kernel code was compiled before,
# so `embtrain run` starts training at once; anything else (half tables) compiles
# on first use, announced. scripts/test.sh compiles the full set.
#
# --tfra makes (or reuses) .venv-tfra, the environment of `embtrain bench --baseline tfra`
# only, and touches nothing else:
# TensorFlow Recommenders-Addons 0.8.1 needs TensorFlow <= 2.16 and, on CPU, the
# full tensorflow wheel (tensorflow-cpu lacks CUDA runtime symbols its ops link).
# About 2.5 GB; CI does not make it.
#
# `bash scripts/bootstrap.sh --fbgemm` makes (or reuses) .venv-fbgemm, the environment of
# `embtrain bench --baseline fbgemm` only: FBGEMM's CPU table-batched embedding
# (fbgemm-gpu-cpu 1.8.0) needs exactly the torch it was built against (2.13.0, the CPU wheel
# of https://download.pytorch.org/whl/cpu, or $EMBTRAIN_TORCH_INDEX). About 1 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

if [ "${1:-}" = "--tfra" ]; then
  TFRA_VENV=${EMBTRAIN_TFRA_VENV:-$ROOT/.venv-tfra}
  TFRA_PY=${PYTHON:-python3.11}
  TFRA_PINS=("tensorflow==2.16.2" "tensorflow-recommenders-addons==0.8.1" "numpy>=1.26,<2" "pyarrow")
  TFRA_STAMP_INPUT="${TFRA_PINS[*]}"
  if [ -f "$TFRA_VENV/.tfra-stamp" ] && [ "$(cat "$TFRA_VENV/.tfra-stamp")" = "$TFRA_STAMP_INPUT" ] \
     && "$TFRA_VENV/bin/python" -c "import tensorflow_recommenders_addons" >/dev/null 2>&1; then
    echo "bootstrap: $TFRA_VENV is ready" >&2
    exit 0
  fi
  command -v "$TFRA_PY" >/dev/null 2>&1 || { echo "bootstrap: --tfra needs $TFRA_PY (TFRA 0.8.1 has wheels for Python 3.9-3.11)" >&2; exit 2; }
  # The pinned versions must exist in the package index before anything is made.
  for pin in "tensorflow==2.16.2" "tensorflow-recommenders-addons==0.8.1"; do
    name=${pin%%==*} version=${pin##*==}
    if ! "$TFRA_PY" -m pip index versions "$name" 2>/dev/null | grep -q "Available versions:.*\b$version\b"; then
      echo "bootstrap: $name $version is not in the package index (or it cannot be reached); cannot make $TFRA_VENV" >&2
      exit 2
    fi
  done
  echo "bootstrap: setting up $TFRA_VENV for --baseline tfra (downloads about 600 MB)" >&2
  [ -x "$TFRA_VENV/bin/python" ] || "$TFRA_PY" -m venv "$TFRA_VENV"
  "$TFRA_VENV/bin/python" -m pip --disable-pip-version-check -q install --upgrade pip
  "$TFRA_VENV/bin/python" -m pip --disable-pip-version-check -q install "${TFRA_PINS[@]}"
  TF_CPP_MIN_LOG_LEVEL=3 "$TFRA_VENV/bin/python" -c \
    "import tensorflow_recommenders_addons.dynamic_embedding as de; print('bootstrap: TFRA', de.__name__, 'imports')" >&2
  echo "$TFRA_STAMP_INPUT" > "$TFRA_VENV/.tfra-stamp"
  echo "bootstrap: done ($TFRA_VENV)" >&2
  exit 0
elif [ "${1:-}" = "--fbgemm" ]; then
  FBGEMM_VENV=${EMBTRAIN_FBGEMM_VENV:-$ROOT/.venv-fbgemm}
  FBGEMM_PY=${PYTHON:-python3.11}
  TORCH_INDEX=${EMBTRAIN_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
  # fbgemm-gpu-cpu and torch come in matching pairs (1.8 <-> 2.13): change both or neither.
  FBGEMM_PINS=("torch==2.13.0+cpu" "fbgemm-gpu-cpu==1.8.0" "numpy>=1.26")
  FBGEMM_STAMP_INPUT="${FBGEMM_PINS[*]}"
  if [ -f "$FBGEMM_VENV/.fbgemm-stamp" ] && [ "$(cat "$FBGEMM_VENV/.fbgemm-stamp")" = "$FBGEMM_STAMP_INPUT" ] \
     && "$FBGEMM_VENV/bin/python" -c "import torch, fbgemm_gpu" >/dev/null 2>&1; then
    echo "bootstrap: $FBGEMM_VENV is ready" >&2
    exit 0
  fi
  command -v "$FBGEMM_PY" >/dev/null 2>&1 || { echo "bootstrap: --fbgemm needs $FBGEMM_PY" >&2; exit 2; }
  # The pinned versions must exist in the package index before anything is made.
  for pin in "torch==2.13.0+cpu" "fbgemm-gpu-cpu==1.8.0"; do
    name=${pin%%==*} version=${pin##*==}
    if ! "$FBGEMM_PY" -m pip index versions "$name" --extra-index-url "$TORCH_INDEX" 2>/dev/null \
         | sed -n 's/^Available versions: //p' | tr ',' '\n' | tr -d ' ' | grep -qxF "$version"; then
      echo "bootstrap: $name $version is not in the package index or $TORCH_INDEX (or they cannot be reached); cannot make $FBGEMM_VENV" >&2
      exit 2
    fi
  done
  echo "bootstrap: setting up $FBGEMM_VENV for --baseline fbgemm (downloads about 250 MB)" >&2
  [ -x "$FBGEMM_VENV/bin/python" ] || "$FBGEMM_PY" -m venv "$FBGEMM_VENV"
  "$FBGEMM_VENV/bin/python" -m pip --disable-pip-version-check -q install \
    --extra-index-url "$TORCH_INDEX" "${FBGEMM_PINS[@]}"
  "$FBGEMM_VENV/bin/python" -c \
    "import torch, fbgemm_gpu; print('bootstrap: torch', torch.__version__, 'fbgemm_gpu', fbgemm_gpu.__version__, 'import')" >&2
  echo "$FBGEMM_STAMP_INPUT" > "$FBGEMM_VENV/.fbgemm-stamp"
  echo "bootstrap: done ($FBGEMM_VENV)" >&2
  exit 0
fi
WITH_HOROVOD=0
WITH_DEV=0
for arg in "$@"; do
  case $arg in
    --horovod) WITH_HOROVOD=1 ;;
    --dev) WITH_HOROVOD=1; WITH_DEV=1 ;;
    *) echo "bootstrap: unknown argument $arg; give none (one process), --horovod, --dev, --tfra or --fbgemm" >&2
       exit 2 ;;
  esac
done
VENV=${EMBTRAIN_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

TF_VERSION=2.18.1
HOROVOD_VERSION=0.28.1
STAMP_INPUT="tf=$TF_VERSION hvd=$HOROVOD_VERSION $(sha256sum pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)"
STAMP="$VENV/.embtrain-stamp"
DEV_STAMP="$VENV/.embtrain-stamp-dev"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

stamped() {  # stamped FILE: FILE holds this set-up's stamp
  [ -f "$1" ] && [ "$(cat "$1")" = "$STAMP_INPUT" ]
}

if ! { stamped "$STAMP" && "$VENV/bin/python" -c "import embtrain" 2>/dev/null; }; then
  echo "bootstrap: setting up $VENV (first run takes a few minutes)" >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "${PIP[@]}" install --upgrade pip
  # one resolve and download for TensorFlow (the cpu extra), embtrain and their dependencies;
  # numpy is capped by TF 2.18
  "${PIP[@]}" install -e ".[cpu]" "numpy>=1.26,<2.1"
  echo "$STAMP_INPUT" > "$STAMP"
fi
if [ "$WITH_DEV" = 1 ] && ! stamped "$DEV_STAMP"; then
  echo "bootstrap: installing the test and docs tools (pytest, ruff, mkdocs)" >&2
  "${PIP[@]}" install -e ".[cpu,dev]" "numpy>=1.26,<2.1"
  echo "$STAMP_INPUT" > "$DEV_STAMP"
fi
if [ "$WITH_HOROVOD" = 1 ] && ! "$VENV/bin/python" -c "import horovod.runner.common.util.hosts" 2>/dev/null; then
  echo "bootstrap: building horovod $HOROVOD_VERSION with Gloo (2-4 minutes)" >&2
  # Horovod's build needs TensorFlow importable, hence --no-build-isolation (and setuptools
  # and wheel in the environment)
  "${PIP[@]}" install --upgrade setuptools wheel
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
    "${PIP[@]}" install --no-build-isolation --no-cache-dir "horovod==$HOROVOD_VERSION"
fi
"$VENV/bin/python" -m embtrain.cli.warm --if-needed
