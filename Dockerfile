# syntax=docker/dockerfile:1
# modelgate: build with the Rust toolchain, run from a distroless image (no shell, no package
# manager) as a numeric non-root user.
#   docker build -t modelgate:dev .
# Builder and runtime are both Debian 12 (bookworm), so the binary's glibc matches the runtime's.

FROM rust:1.95-bookworm AS build
# The commit `modelgate --version` reports (.git is not in the build context):
# scripts/build-image.sh passes it.
ARG MODELGATE_COMMIT=unknown
ARG MODELGATE_COMMIT_DATE=
ENV MODELGATE_COMMIT=$MODELGATE_COMMIT MODELGATE_COMMIT_DATE=$MODELGATE_COMMIT_DATE
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target folder between builds; the binary is copied out of
# the (unexported) target cache.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin modelgate \
    && install -D -m 0755 target/release/modelgate /out/modelgate

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="modelgate" \
      org.opencontainers.image.description="Kubernetes admission webhook for ML model serving" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/modelgate /usr/local/bin/modelgate
# Numeric, so the kubelet can verify runAsNonRoot. The process needs no writable path.
USER 65532:65532
# 8443: webhook (TLS); 8080: /healthz, /readyz, /metrics (plain HTTP).
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/modelgate"]
CMD ["serve"]
