# syntax=docker/dockerfile:1
# The cojob image: one static binary (controller, sidecar, CLI) on distroless/static, non-root,
# for the architecture of the machine that builds it (amd64 or arm64; `docker buildx build
# --platform linux/arm64,linux/amd64` builds both, under emulation where needed).
#
#   docker build -t localhost/cojob/cojob:dev .
#
# The binary is glibc with crt-static (rustls, no OpenSSL), the same build as
# e2e/images/build-cojob; the build fails if it is not static. The run stage has the CA bundle
# (the S3, GCS and Azure clients verify TLS with it) and user 65532, and needs nothing writable:
# the chart runs it with a read-only root filesystem.
ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eux; \
    target="$(rustc -vV | sed -n 's/^host: //p')"; \
    # jemalloc (the binary's allocator) fixes its page size when it is built; arm64 kernels
    # use 4, 16 or 64 KiB pages, so arm64 builds take 64 KiB, which runs on all three.
    case "$target" in aarch64-*) export JEMALLOC_SYS_WITH_LG_PAGE=16 ;; esac; \
    RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build --release --locked -p cojob-controller --target "$target"; \
    cp "target/$target/release/cojob" /cojob; \
    if ldd /cojob 2>&1 | grep -q '=>'; then echo "/cojob is dynamically linked" >&2; exit 1; fi; \
    /cojob version

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /cojob /cojob
USER 65532:65532
ENTRYPOINT ["/cojob"]
