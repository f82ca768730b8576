# syntax=docker/dockerfile:1
# pyrula-stream's image: the package and its extras in a virtualenv, run as a non-root
# user, with `pyrula-stream` as the entry point. Add your agents with an image FROM this
# one (docs/kubernetes.md), or mount a module and put its folder on PYTHONPATH.
#
#   make image                                  # docker or podman, whichever is present
#   docker build --build-arg BASE_IMAGE=python:3.11-slim -t pyrula-stream .
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG EXTRAS=gateway,ui,openai,anthropic,otel,uvloop
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/pyrula
COPY pyproject.toml README.md LICENSE /src/
COPY pyrula_stream /src/pyrula_stream
RUN /opt/pyrula/bin/pip install "/src[${EXTRAS}]" \
 && /opt/pyrula/bin/pyrula-stream --help > /dev/null

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="pyrula-stream" \
      org.opencontainers.image.description="LLM agents as Kafka stream processors" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
RUN groupadd --system --gid 10001 pyrula \
 && useradd --system --uid 10001 --gid 10001 --home-dir /app --create-home pyrula
COPY --from=build /opt/pyrula /opt/pyrula
ENV PATH=/opt/pyrula/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYRULA_HEALTH_HOST=0.0.0.0
WORKDIR /app
USER 10001:10001
# The gateway's port, and the worker's health and metrics port as the chart sets it.
EXPOSE 8000 9400
ENTRYPOINT ["pyrula-stream"]
CMD ["--help"]
