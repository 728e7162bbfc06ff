#!/usr/bin/env bash
# On a GPU machine (CUDA, numba-cuda, CuPy; PyTorch for the comparison; no TensorFlow or
# Pydantic needed), from the repository root:
#     bash tests/gpu/run.sh [OUTDIR]
# 1. the shared kernel tests on the real `cuda` backend (against NumPy oracles and the CPU
#    kernels) plus the gpu-marked DLPack test; 2. the engine-only GPU benchmark, DE tiny at
#    batch 65536, side by side with torch.nn.EmbeddingBag + sparse Adagrad; 3. with TensorFlow:
#    `embtrain run` on the GPU vs the CPU and `bench --model tiny` (tests/gpu/e2e.py). Results
#    go to OUTDIR (default: $OUT if set, else ./gpu-results).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-gpu-results}}
mkdir -p "$out"
py=${PYTHON:-python3}
unset NUMBA_ENABLE_CUDASIM
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c "from embtrain.kernels import default_backend as d; b = d(); print('backend:', b); raise SystemExit(b != 'cuda')"
status=0
"$py" -m pytest -q -p no:cacheprovider tests/test_backends.py 2>&1 \
    | tee "$out/kernel_tests.txt" || status=1
"$py" -m pytest -q -p no:cacheprovider tests/test_kernels.py -k cuda 2>&1 \
    | tee -a "$out/kernel_tests.txt" || status=1
# the device hash index and the cuda engine's dynamic tables against the CPU's
"$py" -m pytest -q -p no:cacheprovider tests/test_cuda_dynamic.py 2>&1 \
    | tee -a "$out/kernel_tests.txt" || status=1
"$py" benchmarks/gpu_engine.py --batch 65536 --steps 20 2> >(tee "$out/gpu_engine.txt" >&2) \
    | tee "$out/gpu_engine.json" || status=1
# 3. end to end, where TensorFlow (with CUDA) is installed (the Dockerfile's image): `embtrain
#    run` of the quickstart with train.device: gpu vs cpu (eval AUC within 1e-3) and `embtrain
#    bench --model tiny` on this GPU next to distributed-embeddings' 17.6 ms/step (A100-80GB)
if "$py" -c "import tensorflow" 2>/dev/null; then
    "$py" tests/gpu/e2e.py "$out" 2> >(tee "$out/e2e.txt" >&2) || status=1
else
    echo "tests/gpu/run.sh: TensorFlow is not installed: end-to-end part skipped" >&2
fi
exit $status
