# hvdlite with PyTorch (CPU), TensorFlow (CPU), Open MPI and mpi4py. The default command trains the MNIST
# example on 2 processes, as `make train` does:
#   docker build -t hvdlite . && docker run --rm --shm-size=1g hvdlite
# Ranks on one host exchange data through /dev/shm: Docker's default 64 MB is too small, hence --shm-size.
# Several hosts: give the containers ssh access to each other, then hvdlite-run -H host1:2,host2:2 ...
FROM python:3.11-slim-bookworm

# g++ builds the core; Open MPI (with its headers, should mpi4py build from source) serves hvdlite-run --mpi
# and hvd.init() under mpirun; the ssh client starts ranks on other hosts. Debian's versions are not pinned:
# bookworm replaces them with each security update, and a pin would then break the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ make openmpi-bin libopenmpi-dev openssh-client \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/hvdlite
COPY . .

# Versions are pinned in setup.py's extras (torch==2.13.0, tensorflow-cpu==2.21.0, mpi4py); the CPU-only
# torch wheel comes from PyTorch's index (PyPI's pulls in CUDA). Editable, so that the core is compiled into
# the source tree the examples run from.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -e ".[torch,tensorflow,mpi,examples]" \
    && python examples/make_mnist_idx.py --out data/mnist --train 6000 --test 1000 \
    && hvdlite-run --check-build

# Training needs no privileges (and Open MPI refuses root without --allow-run-as-root).
RUN useradd --uid 10001 --create-home --shell /bin/bash hvdlite \
    && mkdir -p checkpoints \
    && chown -R 10001:10001 data checkpoints
USER 10001

CMD ["hvdlite-run", "-np", "2", "python", "examples/pytorch_mnist.py", "--data-dir", "data/mnist", "--epochs", "2"]
