# syntax=docker/dockerfile:1
# Every rlfleet service's image, from one file. Build from the repository root
# (`make images` does, for each service with its default base):
#
#   docker build --build-arg SERVICE=env -t rlfleet-env:TAG .
#
# Build arguments:
#   SERVICE     env | rollout | learner | ckptsync: the default command and the pip extra
#   EXTRAS      pip extras to install (default: SERVICE); the local CPU profile uses "local"
#   BASE_IMAGE  the official bases by default (make images picks per service):
#               python:3.11-slim-bookworm (env, ckptsync), vllm/vllm-openai (rollout),
#               rayproject/ray (learner); on machines without a registry, a Debian base
#               built from Debian's packages (scripts/images/base.sh)
#   LOCK        constraints file (exact versions); empty on a base whose torch must stay
#               (the vLLM image's CUDA build)
#   UID         the user the service runs as
#   PIP_NO_INDEX, PIP_FIND_LINKS   an offline build from a mounted wheelhouse (make images
#               PROFILE=local passes both); unset, pip uses its index
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG SERVICE=env
ARG EXTRAS=${SERVICE}

# --- the rlfleet wheel, with the gRPC stubs generated as `make proto` makes them
FROM ${BASE_IMAGE} AS wheel
USER root
ARG LOCK=requirements.txt
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.txt ./
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip install -q ${LOCK:+-c /src/$LOCK} grpcio-tools "setuptools>=68" wheel
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY libs ./libs
COPY services ./services
RUN /opt/build/bin/python -m grpc_tools.protoc -I protos --python_out=libs --pyi_out=libs \
      --grpc_python_out=libs protos/rlfleet/v1/*.proto \
 && /opt/build/bin/pip wheel -q --no-deps --no-build-isolation -w /dist .

# --- the requirements pyproject.toml declares for EXTRAS, as a file: the next stage's
# dependency layer is keyed by this file's content, so an edit elsewhere in pyproject.toml
# (a pytest option) does not reinstall torch
FROM ${BASE_IMAGE} AS declared
USER root
ARG EXTRAS
COPY pyproject.toml scripts/images/declared_deps.py /src/
RUN python3 /src/declared_deps.py --pyproject /src/pyproject.toml "${EXTRAS}" > /requirements-declared.txt

# --- the service
FROM ${BASE_IMAGE}
USER root
# SERVICE is declared only after the dependencies' layer: services with the same extras
# share that layer (the local profile's rollout and learner images: one torch layer).
ARG EXTRAS
ARG LOCK=requirements.txt
ARG UID=10001
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 HOME=/tmp HF_HOME=/tmp/hf \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
WORKDIR /opt/rlfleet
# Dependencies first, pyproject.toml's declarations for these extras: this layer changes
# only with them or the lock, not with the code. --system-site-packages: on the vLLM and
# Ray bases the venv sees the torch, vLLM and Ray they ship.
COPY requirements.txt ./
COPY --from=declared /requirements-declared.txt ./
RUN python3 -m venv --system-site-packages /opt/venv \
 && pip install -q ${LOCK:+-c /opt/rlfleet/$LOCK} -r requirements-declared.txt
COPY scripts/images/entrypoint.sh ./
# The warm start `make run` trains from (4 MB): the local profile's model
# (values-local.yaml `model`).
COPY warm-starts/tiny-sft-feedback /opt/rlfleet/models/tiny-sft-feedback
ARG SERVICE
ENV RLFLEET_SERVICE=${SERVICE}
COPY --from=wheel /dist /opt/rlfleet/dist
RUN pip install -q --no-deps /opt/rlfleet/dist/rlfleet-*.whl \
 && (getent group "${UID}" >/dev/null || groupadd --gid "${UID}" rlfleet) \
 && (getent passwd "${UID}" >/dev/null || useradd --uid "${UID}" --gid "${UID}" --no-create-home \
      --home-dir /tmp --shell /usr/sbin/nologin rlfleet) \
 && chmod 0755 /opt/rlfleet/entrypoint.sh
USER ${UID}
# With no arguments the image runs its service (entrypoint.sh); the chart passes its own.
ENTRYPOINT ["/opt/rlfleet/entrypoint.sh"]
