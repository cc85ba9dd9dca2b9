# hvdlite on CPUs: PyTorch, TensorFlow with Keras 3, Open MPI and an ssh server for multi-host jobs.
#   docker build -t hvdlite .
#   docker run --rm --shm-size=1g hvdlite                 # trains the MNIST example on 2 processes
#   docker run --rm hvdlite hvdlite-run --check-build
# Ranks on one host exchange data through /dev/shm: Docker's default 64 MB is too small, hence --shm-size.
# Several hosts: docs/install.md (start the containers with the `sshd` command and a mounted key pair).
# The GPU image is Dockerfile.gpu.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: the wheel, and the MPI plugin compiled against the image's Open MPI ----
FROM ${PYTHON_IMAGE} AS build
# Debian's versions are not pinned: bookworm replaces them with each security update, and a pin would then break
# the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ libopenmpi-dev openmpi-bin \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY setup.py pyproject.toml ./
COPY hvdlite_core hvdlite_core
COPY hvdlite hvdlite
COPY launcher launcher
RUN pip wheel --no-deps --wheel-dir /dist . \
    && HVDLITE_MPI_PLUGIN_CACHE=/tmp/plugin PYTHONPATH=/src python -m hvdlite.common.mpi_plugin > /tmp/plugin-path \
    && cp "$(cat /tmp/plugin-path)" /dist/_hvdlite_mpi.so

# ---- run: the frameworks, the wheel, no compiler ----
FROM ${PYTHON_IMAGE}
# Open MPI's runtime serves hvdlite-run --mpi and hvd.init() under mpirun; ssh starts ranks on other hosts.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openmpi-bin openssh-client openssh-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /run/sshd
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HVDLITE_MPI_PLUGIN=/opt/hvdlite/_hvdlite_mpi.so

# The frameworks come before hvdlite's own files, so that an edit to the sources rebuilds only the layers below.
# PyPI's torch wheel carries CUDA: the CPU build comes from PyTorch's index. Versions: constraints.txt.
COPY constraints.txt /opt/hvdlite/constraints.txt
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -c /opt/hvdlite/constraints.txt \
        torch tensorflow-cpu keras mpi4py tqdm cffi cloudpickle numpy

COPY --from=build /dist/ /opt/hvdlite/
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN pip install --no-deps /opt/hvdlite/hvdlite-*.whl \
    && hvdlite-run --check-build | tee /tmp/check-build \
    && grep -q "\[X\] MPI (Open MPI" /tmp/check-build \
    && grep -q "\[X\] PyTorch" /tmp/check-build \
    && rm /tmp/check-build

# Training needs no privileges (and Open MPI refuses root without --allow-run-as-root).
RUN useradd --uid 10001 --create-home --shell /bin/bash hvdlite
WORKDIR /home/hvdlite
COPY --chown=10001:10001 examples examples
COPY docker/entrypoint.sh /usr/local/bin/hvdlite-entrypoint
USER 10001
RUN python examples/make_mnist_idx.py --out data/mnist --train 6000 --test 1000 && mkdir checkpoints

ENTRYPOINT ["hvdlite-entrypoint"]
CMD ["hvdlite-run", "-np", "2", "python", "examples/pytorch_mnist.py", "--data-dir", "data/mnist", "--epochs", "2"]
