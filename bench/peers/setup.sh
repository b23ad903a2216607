#!/usr/bin/env bash
# Make the keyword-spotting peers' own virtualenv, .venv-peers at the repository root (idempotent).
# The peers are benchmark references, never edgelearn dependencies: nothing here goes in pyproject.toml.
#   bash bench/peers/setup.sh        (make bench runs it through the .venv-peers/bin/python target)
set -uo pipefail
cd "$(dirname "$0")/../.."

VENV=.venv-peers
PINS=(pocketsphinx==5.1.1 pyopen-wakeword==1.1.0 pymicro-wakeword==2.5.0 'numpy>=1.24,<3')
CHECK='import importlib.metadata as m, numpy, pocketsphinx, pyopen_wakeword, pymicro_wakeword; assert m.version("pocketsphinx") == "5.1.1"; assert m.version("pyopen-wakeword") == "1.1.0"; assert m.version("pymicro-wakeword") == "2.5.0"'

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
  exit 0  # already set up
fi

made=0
if [ ! -x "$VENV/bin/python" ]; then
  if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
    rm -rf "$VENV"
    echo "bench/peers/setup.sh: 'python3 -m venv $VENV' failed (on Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
  made=1
fi

log=$(mktemp "${TMPDIR:-/tmp}/peers-setup.XXXXXX.log")
if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PINS[@]}" >"$log" 2>&1 \
   || ! "$VENV/bin/python" -c "$CHECK" >>"$log" 2>&1; then
  [ "$made" = 1 ] && rm -rf "$VENV"  # leave no half-made venv behind for make to take as done
  echo "bench/peers/setup.sh: pip install ${PINS[*]} into $VENV failed (full log: $log)" >&2
  exit 1
fi
rm -f "$log"
echo "bench/peers/setup.sh: $VENV ready (pocketsphinx 5.1.1, pyopen-wakeword 1.1.0, pymicro-wakeword 2.5.0)"
