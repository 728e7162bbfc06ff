#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: lint, unit, distributed (horovodrun -np 2
# over Gloo) and slow tests, then the CUDA kernels under numba's CUDA simulator (their own
# invocation: the simulator must be switched on before numba's CUDA module is imported), and
# `embtrain run` on a simulated GPU against the CPU run.
# GPU tests are skipped where CUDA is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3}
.venv/bin/ruff check embtrain tests benchmarks scripts
# every kernel specialisation the suite meets (half tables, every optimizer), compiled once by
# two processes balanced by compile time, rather than on first use inside tests (two workers
# compiling the same kernel side by side, within tests' time limits)
.venv/bin/python -m embtrain.cli.warm --set full --if-needed
# two workers (pytest-xdist): most tests start processes that import TensorFlow and wait on
# one core while the other works; on this 2-core machine the suite takes 17.5 instead of 22.6
# minutes. EMBTRAIN_TEST_WORKERS=0 runs it in one process.
.venv/bin/python -m pytest -q -n "${EMBTRAIN_TEST_WORKERS:-2}" "$@"
# the cuda backend's kernels (run thread by thread by the simulator) against the NumPy oracles
# and the CPU kernels, and the engine end to end on cuda; the cpu cases ran above
NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_backends.py tests/test_kernels.py tests/test_cuda_halfs.py -k cuda
# the device hash index against the CPU one, the cuda engine's dynamic tables (their key -> row
# phase on the device) against the CPU engine's, and `embtrain run` with train.device: gpu end
# to end under the simulator (1 and 2 ranks, resume, a tiered and a dynamic table) against the CPU
NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_cuda_dynamic.py tests/test_sim_e2e.py
