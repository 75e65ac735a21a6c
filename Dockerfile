# syntax=docker/dockerfile:1
#
# The window-sidecar container image: a release build on Debian bookworm, copied into a
# distroless runtime that holds only glibc, libgcc, CA certificates and the binary.
#
#   docker build -t ghcr.io/example/window-sidecar:0.1.0 .
#
# The Helm chart (helm/window-sidecar) points image.repository at this image and passes the
# listen addresses as args: --listen=127.0.0.1:50051 (only the pod's own containers),
# --health-listen=0.0.0.0:50052 and --metrics-listen=0.0.0.0:9090 (for the kubelet and
# Prometheus). Without args the binary serves gRPC on 127.0.0.1:50051 only.

# Keep in step with rust-toolchain.toml: the same compiler as developers and CI.
ARG RUST_VERSION=1.95.0

FROM rust:${RUST_VERSION}-bookworm AS builder
ARG RUST_VERSION
# Use the image's toolchain as is: rust-toolchain.toml would otherwise have rustup fetch the
# rustfmt and clippy components, which a release build does not need.
ENV RUSTUP_TOOLCHAIN=${RUST_VERSION} \
    CARGO_TERM_COLOR=never
WORKDIR /src
# protoc comes from the protoc-bin-vendored build dependency: no apt packages are needed.
COPY . .
# The caches keep crates and build artefacts between builds; the binary is copied out of the
# cached target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release -p window-sidecar --locked \
    && install -D -m 0755 target/release/window-sidecar /out/window-sidecar

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="window-sidecar" \
      org.opencontainers.image.description="A gRPC sidecar that holds the window of a pipelined Redis subscription for applications in any language." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://example.invalid/window-sidecar"
COPY --from=builder /out/window-sidecar /usr/local/bin/window-sidecar
# nonroot in distroless: uid and gid 65532, the same as the chart's securityContext.
USER 65532:65532
# 50051 gRPC window service, 50052 gRPC health (probes), 9090 Prometheus metrics.
EXPOSE 50051 50052 9090
ENTRYPOINT ["/usr/local/bin/window-sidecar"]
