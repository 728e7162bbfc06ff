#!/usr/bin/env bash
# The whole device check, for a GPU machine with CUDA, numba-cuda, CuPy and JAX (PyTorch for
# the comparison; no TensorFlow or Pydantic needed: Pydantic and Keras come from the wheels
# tests/gpu/wheels.sh downloaded here, installed with pip --no-index --no-deps --target).
# From the repository root:
#     bash tests/gpu/run.sh [OUTDIR]       everything to OUTDIR (default: $OUT, else ./gpu-results)
#     bash tests/gpu/run.sh --dry-run      print the device command and what it carries
# In order, each part under its own time limit (seconds below), so one slow part cannot eat
# the rest; at most 8 minutes in all:
#   1. import check (embtrain, the cuda backend, JAX's devices) and nvidia-smi        (60)
#   2. the kernel tests on the real `cuda` backend: test_backends, the cuda cases of
#      test_kernels, test_cuda_dynamic                                                (150)
#   3. benchmarks/gpu_engine.py: the engine alone vs torch.nn.EmbeddingBag + Adagrad  (75)
#   4. `embtrain run recipes/quickstart.yaml` with train.device: gpu (JAX dense) and cpu:
#      eval AUCs within 1e-3 (tests/gpu/e2e.py quickstart)                            (120)
#   5. `embtrain bench --model tiny --device gpu`: the whole step, next to
#      distributed-embeddings' 24.433 ms/step on one DGX-A100 GPU (e2e.py bench)      (60)
# Results go to docs/PERFORMANCE.md with the card's name (nvidia-smi.txt).
set -uo pipefail
cd "$(dirname "$0")/../.."
WHEELS=tests/gpu/wheels
if [ "${1:-}" = "--dry-run" ]; then
  [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1 || {
    echo "run.sh: no wheels in $WHEELS: run bash tests/gpu/wheels.sh first" >&2; exit 1; }
  tree_kib=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  wheels_kib=$(du -cb "$WHEELS"/*.whl | tail -1 | cut -f1)
  echo "device command: bash tests/gpu/run.sh   (carry: [\"$WHEELS\"], timeout_s: 540)"
  echo "carried: working tree $((tree_kib / 1024)) KiB + $WHEELS $((wheels_kib / 1024)) KiB" \
       "= $(((tree_kib + wheels_kib) / 1024)) KiB of 65536 KiB"
  echo "time limits: 60 + 150 + 75 + 120 + 60 = 465 s (8 minutes at most: 480 s)"
  exit $(( tree_kib + wheels_kib > 64 * 1024 * 1024 ))
fi
out=${1:-${OUT:-gpu-results}}
mkdir -p "$out"
py=${PYTHON:-python3}
unset NUMBA_ENABLE_CUDASIM KERAS_BACKEND
site=$(mktemp -d)
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --target "$site" "$WHEELS"/*.whl \
      > "$out/wheels.txt" 2>&1 || echo "run.sh: installing the wheels failed (see wheels.txt)" >&2
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=3
status=0
part() {  # part NAME SECONDS COMMAND...: run it under its limit, its output to OUT/NAME.txt
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "run.sh: $name: exit $rc after $((SECONDS - t0)) s (limit $limit s)" | tee -a "$out/parts.txt"
  [ $rc -eq 0 ] || status=1
  tail -n 5 "$out/$name.txt"
}
part imports 60 bash -c "nvidia-smi > '$out/nvidia-smi.txt' 2>&1; cat '$out/nvidia-smi.txt'; \
  '$py' -c 'import embtrain, jax, keras; from embtrain.kernels import default_backend as d; \
b = d(); print(\"backend:\", b, \"jax:\", jax.__version__, jax.devices(), \"keras:\", keras.__version__); \
raise SystemExit(b != \"cuda\")'"
part kernel_tests 150 bash -c "'$py' -m pytest -q -p no:cacheprovider tests/test_backends.py \
    tests/test_cuda_dynamic.py; a=\$?; '$py' -m pytest -q -p no:cacheprovider \
    tests/test_kernels.py -k cuda; b=\$?; exit \$((a || b))"
part gpu_engine 75 bash -c "'$py' benchmarks/gpu_engine.py --batch 65536 --steps 20 \
    | tee '$out/gpu_engine.json'"
part quickstart 120 "$py" tests/gpu/e2e.py quickstart "$out" --rows 200000
part bench_tiny 60 "$py" tests/gpu/e2e.py bench "$out"
rm -rf "$site"
exit $status
