# syntax=docker/dockerfile:1
#
# The window-sidecar container image: a release build on Debian bookworm, copied into a
# distroless runtime that holds only glibc, libgcc, CA certificates and the binary.
#
#   docker build -t ghcr.io/example/window-sidecar:0.1.0 .
#
# The binary in the image is stripped of its debug sections: the release profile keeps line
# tables (Cargo.toml, debug = "line-tables-only"), which are most of its size. They are kept in
# window-sidecar.debug, linked from the binary by a .gnu_debuglink, which the debug-symbols
# stage exports for symbolizing a crash or a profile:
#
#   docker build --target debug-symbols --output type=local,dest=debug-symbols .
#
# Base images are pinned by digest (published digests of these tags; the digest wins over the
# tag). To move one, look up the tag's current digest (`docker buildx imagetools inspect
# rust:1.95.0-bookworm`, the Digest line) and replace it here; keep the builder's tag in step
# with rust-toolchain.toml.
#
# The Helm chart (helm/window-sidecar) points image.repository at this image and passes the
# listen addresses as args: --listen=127.0.0.1:50051 (only the pod's own containers),
# --health-listen=0.0.0.0:50052 and --metrics-listen=0.0.0.0:9090 (for the kubelet and
# Prometheus). Without args the binary serves gRPC on 127.0.0.1:50051 only.

# The compiler of rust-toolchain.toml, the same as developers and CI: keep the tag and
# RUSTUP_TOOLCHAIN in step with it (image_check.py checks both). The version is written out, not
# a build argument: the digest pins the image whatever the tag says.
FROM rust:1.95.0-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS builder
# Use the image's toolchain as is: rust-toolchain.toml would otherwise have rustup fetch the
# rustfmt and clippy components, which a release build does not need.
ENV RUSTUP_TOOLCHAIN=1.95.0 \
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
    && install -D -m 0755 target/release/window-sidecar /out/window-sidecar.full
# The line tables go to window-sidecar.debug; the image's binary keeps its symbol table (so a
# panic's backtrace still names functions) and a .gnu_debuglink to the debug file. objcopy is
# binutils, part of the rust image.
RUN objcopy --only-keep-debug /out/window-sidecar.full /out/window-sidecar.debug \
    && objcopy --strip-debug --add-gnu-debuglink=/out/window-sidecar.debug \
       /out/window-sidecar.full /out/window-sidecar \
    && rm /out/window-sidecar.full

# The debug file on its own: `docker build --target debug-symbols --output type=local,dest=DIR .`
FROM scratch AS debug-symbols
COPY --from=builder /out/window-sidecar.debug /window-sidecar.debug

FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
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
