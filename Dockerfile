# embtrain on a CUDA 12 machine: TensorFlow 2.18.1 with CUDA, CuPy, and Horovod 0.28.1
# built with NCCL (GPU collectives) and Gloo (launcher, CPU fallback).
# Kept consistent with scripts/bootstrap.sh --horovod: same TensorFlow and Horovod versions and
# build flags (the image always has Horovod: a GPU machine runs several ranks).
#
#   docker build -t embtrain:gpu .
#   docker run --gpus all --rm -v $PWD:/work -w /work embtrain:gpu embtrain run recipes/quickstart.yaml
#   docker run --gpus all --rm -v $PWD:/work -w /work embtrain:gpu bash tests/gpu/run.sh gpu-results
# (NCCL: the dense all-reduce of GPU tensors and HorovodComm.alltoallv_rows of CuPy arrays;
#  `horovodrun --check-build` below lists it.)
FROM nvidia/cuda:12.5.1-cudnn-devel-ubuntu22.04

ARG TF_VERSION=2.18.1
ARG HOROVOD_VERSION=0.28.1
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1

RUN apt-get update && apt-get install -y --no-install-recommends \
        software-properties-common git cmake g++ make curl ca-certificates \
    && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-dev python3.11-venv \
    && apt-get install -y --no-install-recommends --allow-change-held-packages libnccl2 libnccl-dev \
    && rm -rf /var/lib/apt/lists/*

RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv

RUN pip install --upgrade pip setuptools wheel \
    && pip install "tensorflow[and-cuda]==${TF_VERSION}" "numpy>=1.26,<2.1" "cupy-cuda12x>=13"

# Horovod needs TensorFlow importable at build time, hence --no-build-isolation.
RUN HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    pip install --no-build-isolation "horovod==${HOROVOD_VERSION}" \
    && horovodrun --check-build

WORKDIR /opt/embtrain
COPY pyproject.toml README.md ./
COPY embtrain ./embtrain
COPY recipes ./recipes
COPY schemas ./schemas
RUN pip install ".[gpu]" "numpy>=1.26,<2.1"
# The CPU kernels (numba: data reading, dynamic and tiered tables, the CPU backend), every
# specialisation, compiled into the image where any user finds them, so that `docker run`
# loads them instead of compiling for minutes. numba keys them by the build machine's CPU
# model too: on a host with another CPU they compile again, once per container (mount a
# volume at $EMBTRAIN_CACHE_DIR to keep them). The CUDA kernels compile on first use.
ENV EMBTRAIN_CACHE_DIR=/opt/embtrain/cache
RUN python -m embtrain.cli.warm --set full && chmod -R a+rX /opt/embtrain/cache
# what `bash tests/gpu/run.sh` needs besides (repository mounted at /work): pytest, and PyTorch
# for the kernel benchmark's side-by-side (EmbeddingBag + sparse Adagrad); WITH_GPU_TESTS=0 skips
ARG WITH_GPU_TESTS=1
RUN if [ "$WITH_GPU_TESTS" = 1 ]; then pip install pytest torch "numpy>=1.26,<2.1"; fi

WORKDIR /work
CMD ["embtrain", "--help"]
