#!/usr/bin/env bash
# Set up everything edgelearn needs on a fresh Debian/Ubuntu machine or a Raspberry Pi:
# the speech synthesizers (Debian packages) and a virtualenv in .venv with the
# project and its extras. Idempotent: a second run only checks.
#   usage: scripts/bootstrap.sh [EXTRAS]      (default: host,serve,dev)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-host,serve,dev}"

# asterisk-core-sounds-en-wav: real human speech (one speaker) for the kws_base benchmark;
# asterisk-core-sounds-ru-wav, -es-wav: real speech of other speakers/languages, never trained on, for
# kws_base's false accepts (host/data/realneg.py);
# postgresql: the server the PostgreSQL store's tests start in a temporary directory (never as a service);
# iproute2: the network namespaces of the Wyoming zeroconf test
apt_pkgs=(espeak-ng festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts flite sox asterisk-core-sounds-en-wav
          asterisk-core-sounds-ru-wav asterisk-core-sounds-es-wav)
case ",$extras," in *,dev,*) apt_pkgs+=(postgresql iproute2) ;; esac
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($py --version)"
  "$py" -m venv .venv
fi
stamp=.venv/.edgelearn-installed
want="$(cat pyproject.toml | sha256sum | cut -c1-16)-$extras"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing edgelearn[$extras] into .venv (first time takes a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[$extras]"
  case ",$extras," in
    *,dev,*) # Test reference for the DP accountant; see the note in pyproject.toml's dev extra.
      .venv/bin/python -m pip install -q --no-deps "dp-accounting==0.6.0" ;;
  esac
  echo "$want" > "$stamp"
fi

# The reference venv of `edgelearn export esphome`'s check (tests/test_export_esphome.py loads the
# export in pymicro-wakeword) and of bench/esphome_export: two small wheels and numpy (Makefile's
# .venv-mww target). Skipped without the dev extra.
case ",$extras," in
  *,dev,*)
    if [ ! -x .venv-mww/bin/python ] || ! .venv-mww/bin/python -c "import pymicro_wakeword, pymicro_features" 2>/dev/null; then
      echo "bootstrap: creating .venv-mww (pymicro-wakeword, the export's reference)"
      { "$py" -m venv .venv-mww && .venv-mww/bin/python -m pip install -q pymicro-wakeword==2.5.0 pymicro-features==2.0.2; } ||
        { rm -rf .venv-mww; echo "bootstrap: could not set up .venv-mww; its test will skip (make .venv-mww/bin/python)"; }
    fi ;;
esac
