# syntax=docker/dockerfile:1
# The end-to-end tests' workload image for the kind path (localhost/cojob/busybox:e2e): busybox
# with /bin/sh as its entrypoint, and the smoke test's sidecar at /usr/local/bin, as the local
# cluster's image made by e2e/images/build-all. Built from the repository root:
#
#   docker build -f e2e/kind/busybox.Dockerfile -t localhost/cojob/busybox:e2e .
ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eux; \
    target="$(rustc -vV | sed -n 's/^host: //p')"; \
    RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build --release --locked -p cojob-smoke-sidecar --target "$target"; \
    cp "target/$target/release/cojob-smoke-sidecar" /cojob-smoke-sidecar

FROM docker.io/library/busybox:1.36.1-musl
COPY --from=build /cojob-smoke-sidecar /usr/local/bin/cojob-smoke-sidecar
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENTRYPOINT ["/bin/sh"]
