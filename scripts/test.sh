#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: lint, unit, distributed (horovodrun -np 2
# over Gloo) and slow tests, then the CUDA kernels under numba's CUDA simulator (their own
# invocation: the simulator must be switched on before numba's CUDA module is imported), and
# `embtrain run` on a simulated GPU against the CPU run.
# GPU tests are skipped where CUDA is absent.
# Every part runs even when an earlier one fails (one failure must not hide the others'
# results); the script exits non-zero if any part failed and names the parts that did.
set -uo pipefail
cd "$(dirname "$0")/.."
# the environment with Horovod (the distributed tests) and the test and docs tools
bash scripts/bootstrap.sh --dev || { echo "test.sh: set-up failed" >&2; exit 1; }
# .venv-fbgemm for `bench --baseline fbgemm`'s tests (torch 2.13.0 CPU wheel + fbgemm-gpu-cpu
# 1.8.0: about 190 MB to download, 1 GB on disk, under a minute of CPU; made once, then
# reused). Where the index cannot be reached those tests skip, saying so.
bash scripts/bootstrap.sh --fbgemm \
  || echo "test.sh: no .venv-fbgemm (see above); the fbgemm baseline's tests will skip" >&2
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3}
failed=()
part() {  # part NAME COMMAND...: run one part, remember it if it failed
  local name=$1
  shift
  "$@" || failed+=("$name")
}
part lint .venv/bin/ruff check embtrain tests benchmarks scripts
# the documentation site (mkdocs.yml): a broken link or anchor fails the build; output in site/
part docs env NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
# every kernel specialisation the suite meets (half tables, every optimizer), compiled once by
# two processes balanced by compile time, rather than on first use inside tests (two workers
# compiling the same kernel side by side, within tests' time limits)
part warm .venv/bin/python -m embtrain.cli.warm --set full --if-needed
# two workers (pytest-xdist): most tests start processes that import TensorFlow and wait on
# one core while the other works; on this 2-core machine the suite takes 17.5 instead of 22.6
# minutes. EMBTRAIN_TEST_WORKERS=0 runs it in one process.
part pytest .venv/bin/python -m pytest -q -n "${EMBTRAIN_TEST_WORKERS:-2}" "$@"
# the cuda backend's kernels (run thread by thread by the simulator) against the NumPy oracles
# and the CPU kernels, and the engine end to end on cuda; the cpu cases ran above
part cuda-kernels env NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_backends.py tests/test_kernels.py tests/half/test_half_cuda.py -k cuda
# the device hash index against the CPU one, the cuda engine's dynamic tables (their key -> row
# phase on the device) against the CPU engine's, and `embtrain run` with train.device: gpu end
# to end under the simulator (1 and 2 ranks, resume, a tiered and a dynamic table) against the CPU
part cuda-e2e env NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_cuda_dynamic.py tests/test_sim_e2e.py
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "test.sh: every part passed" >&2
