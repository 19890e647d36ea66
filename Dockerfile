# syntax=docker/dockerfile:1
# Kortex: `kortex` and `kubectl-kortex`, statically linked (musl), on a distroless static
# base as the non-root user 65532. Build: docker build -t kortex:0.1.0 .
# Multi-arch: docker buildx build --platform linux/amd64,linux/arm64 -t REPO/kortex:0.1.0 .

ARG RUST_VERSION=1.95

# Each platform builds natively (under emulation for a foreign one with buildx), so the
# C parts compile with that platform's musl-gcc.
FROM rust:${RUST_VERSION}-bookworm AS build
ARG TARGETARCH
# musl-tools: the C parts (ring, the bundled SQLite) are compiled against musl too.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
RUN case "$TARGETARCH" in \
      amd64) echo x86_64-unknown-linux-musl ;; \
      arm64) echo aarch64-unknown-linux-musl ;; \
      *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1 ;; \
    esac > /rust-target \
 && rustup target add "$(cat /rust-target)"
ENV CC_x86_64_unknown_linux_musl=musl-gcc \
    CC_aarch64_unknown_linux_musl=musl-gcc \
    CARGO_PROFILE_RELEASE_STRIP=symbols
WORKDIR /src

# Dependencies first, from the manifests and the lock file alone, with empty sources: this
# layer is rebuilt only when Cargo.toml or Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
COPY operator/Cargo.toml operator/Cargo.toml
COPY e2e/Cargo.toml e2e/Cargo.toml
RUN mkdir -p operator/src/bin operator/benches e2e/src \
 && echo 'fn main() {}' > operator/src/main.rs \
 && echo 'fn main() {}' > operator/src/bin/kubectl-kortex.rs \
 && echo 'fn main() {}' > operator/benches/gateway.rs \
 && touch operator/src/lib.rs e2e/src/lib.rs \
 && cargo build --release --locked --target "$(cat /rust-target)" -p kortex \
 && rm -rf operator/src operator/benches e2e/src

# Then Kortex itself.
COPY operator operator
COPY e2e e2e
COPY migrations migrations
RUN touch operator/src/main.rs operator/src/lib.rs operator/src/bin/kubectl-kortex.rs \
 && cargo build --release --locked --target "$(cat /rust-target)" -p kortex --bins \
 && mkdir -p /out \
 && cp "target/$(cat /rust-target)/release/kortex" "target/$(cat /rust-target)/release/kubectl-kortex" /out/ \
 && /out/kortex --version

# The claude-code flavour, for LLMProviders of `type: claude-code`: Kortex beside a pinned
# Claude Code CLI (the npm package installs a native glibc binary, so no Node at run time).
# Build: docker build --target claude-code -t kortex:0.1.0-claude-code .
# (chart: image.flavor: claude-code). Your own Claude Code credential goes in a Secret.
FROM node:22-bookworm-slim AS claude-code-cli
ARG CLAUDE_CODE_VERSION=2.1.197
RUN npm install --global --prefix /opt/claude-code "@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION}" \
 && cp -L /opt/claude-code/bin/claude /claude \
 && DISABLE_AUTOUPDATER=1 /claude --version

FROM gcr.io/distroless/base-debian12:nonroot AS claude-code
LABEL org.opencontainers.image.title="kortex" \
      org.opencontainers.image.description="Kubernetes operator and in-cluster LLM chat server, with the Claude Code CLI" \
      org.opencontainers.image.source="https://github.com/kortex-dev/kortex" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/kortex /out/kubectl-kortex /usr/local/bin/
COPY --from=claude-code-cli /claude /usr/local/bin/claude
# The CLI never updates itself in the image; each call gets an empty HOME under /tmp.
ENV DISABLE_AUTOUPDATER=1
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kortex"]
CMD ["run"]

# The default image (the last stage). No shell, no package manager; nonroot = 65532:65532.
FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="kortex" \
      org.opencontainers.image.description="Kubernetes operator and in-cluster LLM chat server" \
      org.opencontainers.image.source="https://github.com/kortex-dev/kortex" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/kortex /out/kubectl-kortex /usr/local/bin/
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kortex"]
CMD ["run"]
