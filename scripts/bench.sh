#!/usr/bin/env bash
# Every performance figure of docs/benchmarks.md in one command: the gateway with LiteLLM
# side by side (scripts/bench-gateway.sh), the chat path per tool round trip (SQLite, and
# PostgreSQL when KORTEX_TEST_POSTGRES_URL is set), configuration changes among 1,000
# tools, and a one-minute soak of 1,000 followed sessions. Not part of the test suite: it
# takes about 15 minutes and all the machine's cores.
#
#   ./scripts/bench.sh
#   KORTEX_BENCH_CONCURRENCY=1000 ./scripts/bench.sh   # the gateway at 1,000 concurrent
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/bench-gateway.sh
cargo bench -p kortex --bench chat_path
cargo bench -p kortex --bench config_change
# The soak opens two sockets per session.
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -ge 8192 ]; then ulimit -n 8192; else ulimit -n "$hard"; fi
KORTEX_SOAK_SECONDS="${KORTEX_SOAK_SECONDS:-60}" cargo bench -p kortex --bench soak
