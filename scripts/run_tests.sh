#!/usr/bin/env bash
# Run the whole suite. pytest's exit code 5 (no tests collected) is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "run_tests: pytest collected no tests - treating as failure" >&2
  exit 1
fi
exit $rc
