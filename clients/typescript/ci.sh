#!/usr/bin/env bash
# CI for the TypeScript client (clients/typescript) and its example (examples/typescript):
# install from the committed lockfiles, build, then run the tests against a real daemon
# (node's own test runner), the npm pack install test and the example.
#
# Needs node >= 20 and npm, and a Python with execbox-runner installed: the repository's
# .venv by default, or EXECBOX_RUNNER_PYTHON. Every daemon the tests start listens on
# 127.0.0.1 and is stopped by its PID.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export EXECBOX_RUNNER_PYTHON="${EXECBOX_RUNNER_PYTHON:-$repo/.venv/bin/python}"
"$EXECBOX_RUNNER_PYTHON" -c 'import execbox_runner' || {
  echo "ci.sh: $EXECBOX_RUNNER_PYTHON cannot import execbox_runner (set EXECBOX_RUNNER_PYTHON)" >&2
  exit 2
}

node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' || {
  echo "ci.sh: node >= 20 is needed (found $(node --version))" >&2
  exit 2
}

cd "$here"
npm ci --no-audit --no-fund
npm run build

# The example links the client (file:../../clients/typescript), so it builds after it.
(cd "$repo/examples/typescript" && npm ci --no-audit --no-fund && npm run build)

EXECBOX_TEST_EXAMPLE_REQUIRED=1 npm test
