#!/usr/bin/env bash
# The gateway benchmark with LiteLLM's proxy side by side, in one command: installs the
# pinned LiteLLM into target/bench-venv when it is missing, then runs
# `cargo bench -p kortex --bench gateway` (results: docs/benchmarks.md). Not part of the
# test suite (it takes minutes and all the machine's cores).
#
#   ./scripts/bench-gateway.sh                      # every row
#   KORTEX_BENCH_ONLY=/50 ./scripts/bench-gateway.sh  # 50 concurrent only
set -euo pipefail
cd "$(dirname "$0")/.."

LITELLM_VERSION=1.108.7
venv=target/bench-venv
if ! "$venv/bin/litellm" --version >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "litellm[proxy]==${LITELLM_VERSION}"
fi
exec cargo bench -p kortex --bench gateway
