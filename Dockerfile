# syntax=docker/dockerfile:1
# The ztunnel-node image that deploy/ztunnel-node (the Helm chart) runs. Published by .github/workflows/release.yml
# on every version tag (ghcr.io/<owner>/ztunnel-node:<version>, linux/amd64 and linux/arm64); `.ci/run` builds it
# when the machine has docker; by hand:  docker build -t <registry>/ztunnel-node:0.1.0 .
#
# Node 24, the current LTS line (N-API: the native module is the same for every Node line). Stage 1 builds the
# native module (Rust, release) and the TypeScript on Debian; stage 2 is a slim Node runtime with what the npm package ships (bin/, dist/ with the .node, examples/) and only the production
# node_modules, plus iptables and iproute2 for inspecting a node's capture rules from inside the pod.

# The Rust toolchain is copied from the official image instead of being downloaded by a script.
FROM rust:1.95-slim-bookworm AS rust

FROM node:24-bookworm AS build
COPY --from=rust /usr/local/cargo /usr/local/cargo
COPY --from=rust /usr/local/rustup /usr/local/rustup
ENV CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup PATH=/usr/local/cargo/bin:$PATH
# As the published binaries: no line tables (the release profile keeps them for profiling) and no symbols.
ENV CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
WORKDIR /src
# Dependencies first, so a source change does not refetch them. --ignore-scripts: `prepare` (the build) runs below,
# once the sources are in.
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY Cargo.toml Cargo.lock tsconfig.json ./
COPY native native
COPY bench/loadgen bench/loadgen
COPY scripts scripts
COPY ts ts
COPY bin bin
# NATIVE_FEATURES=fips: the FIPS build (README "The FIPS build"), whose aws-lc FIPS module builds with CMake and Go.
ARG NATIVE_FEATURES=""
RUN if [ -n "$NATIVE_FEATURES" ]; then \
      apt-get update && apt-get install -y --no-install-recommends cmake golang-go && rm -rf /var/lib/apt/lists/*; \
    fi
RUN node scripts/build-native.mjs --release ${NATIVE_FEATURES:+--features "$NATIVE_FEATURES"} \
 && npm run build:ts && npm prune --omit=dev --no-audit --no-fund

FROM node:24-bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/package.json /opt/ztunnel-node/
COPY --from=build /src/node_modules /opt/ztunnel-node/node_modules
COPY --from=build /src/bin /opt/ztunnel-node/bin
COPY --from=build /src/dist /opt/ztunnel-node/dist
# `ztunnel-node demo` and the README's local-mode example read these.
COPY examples /opt/ztunnel-node/examples
# ztunnel's default file locations are relative (./var/run/secrets/istio/root-cert.pem,
# ./var/run/secrets/tokens/istio-token), so the working directory is / as in Istio's image.
WORKDIR /
# Non-root by default: `ztunnel-node version`, `demo` and PROXY_MODE=local need no privileges. As a node proxy
# (PROXY_MODE=shared, the chart) it must run as root with NET_ADMIN, SYS_ADMIN (setns into pod network namespaces)
# and NET_RAW, and nothing else; the chart sets exactly that, as Istio's ztunnel chart does.
USER node
EXPOSE 15008 15020 15021
# --max-semi-space-size=1: a daemon's young generation; --max-opt=2: no TurboFan (bench/daemon-flags.mjs says why;
# the benchmarks use the same).
ENTRYPOINT ["node", "--max-semi-space-size=1", "--max-opt=2", "/opt/ztunnel-node/bin/ztunnel-node.js"]
CMD ["proxy", "ztunnel"]
