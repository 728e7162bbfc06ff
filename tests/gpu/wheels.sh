#!/usr/bin/env bash
# Download, here, the few wheels the GPU machine lacks into tests/gpu/wheels/ (git-ignored):
# Pydantic (and its core, for CPython 3.12 on x86-64 Linux), Keras 3 and the small packages
# it and Pydantic need. The GPU machine has NumPy 2.x, pyarrow, numba, numba-cuda, CuPy, JAX,
# PyTorch, typer, rich, PyYAML, xxhash and pytest already; tests/gpu/run.sh installs these
# with `pip install --no-index --no-deps --target`. Fails when the total passes 40 MiB.
#     bash tests/gpu/wheels.sh        (idempotent: downloads only what is missing)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-../../.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p wheels
WHEELS=(
  "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0"
  "typing-extensions==4.16.0" "typing-inspection==0.4.5"
  "keras==3.15.1" "absl-py==2.5.1" "namex==0.1.0" "optree==0.20.0" "h5py==3.16.0"
  "packaging==26.4"
)
"$PY" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any \
    -d wheels "${WHEELS[@]}"
total=$(du -cb wheels/*.whl | tail -1 | cut -f1)
ls -1 wheels/*.whl | sed 's|^|wheels.sh: |'
echo "wheels.sh: $(ls wheels/*.whl | wc -l) wheels, $((total / 1024)) KiB in tests/gpu/wheels/"
if [ "$total" -gt $((40 * 1024 * 1024)) ]; then
  echo "wheels.sh: over 40 MiB; the device run carries at most 64 MiB in all" >&2
  exit 1
fi
