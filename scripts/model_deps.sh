#!/usr/bin/env bash
# What `make model` (`edgelearn model`, host/recipe.py) needs beyond scripts/bootstrap.sh: the shipped
# recipe trains on two more synthesizers from Debian's non-free component (RHVoice's English voices bdl
# and clb: rhvoice rhvoice-english; SVOX Pico: libttspico-utils) and on real French and Italian speech
# as negatives (asterisk-core-sounds-fr-wav, -it-wav; host/data/supplement.py). On Debian it adds a
# deb822 source with `contrib non-free` (/etc/apt/sources.list.d/edgelearn-nonfree.sources) when the
# engines are not installable yet, then installs what is missing. Idempotent: a second run only checks.
# (Never `apt-get install asterisk-prompt-*`: apt removes asterisk-core-sounds-es and -fr for them;
# scripts/unpack_prompts.sh unpacks those development speakers instead.)
#   usage: scripts/model_deps.sh
# (EDGELEARN_OS_RELEASE and EDGELEARN_APT_SOURCES stand in for /etc/os-release and
# /etc/apt/sources.list.d in tests.)
set -euo pipefail
cd "$(dirname "$0")/.."
os_release="${EDGELEARN_OS_RELEASE:-/etc/os-release}"
sources="${EDGELEARN_APT_SOURCES:-/etc/apt/sources.list.d}"
pkgs=(rhvoice rhvoice-english libttspico-utils asterisk-core-sounds-fr-wav asterisk-core-sounds-it-wav)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "model_deps: all of ${pkgs[*]} are installed"; exit 0; }
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ "$(apt-cache policy rhvoice libttspico-utils 2>/dev/null | grep -c 'Candidate: [0-9]')" -lt 2 ]; then
  . "$os_release"
  if [ "${ID:-}" != debian ]; then
    echo "model_deps: rhvoice and libttspico-utils are not installable here: enable your distribution's" \
         "non-free (Ubuntu: multiverse) component and run this again" >&2; exit 1
  fi
  echo "model_deps: adding Debian's contrib non-free components for $VERSION_CODENAME"
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$VERSION_CODENAME" | $sudo tee "$sources/edgelearn-nonfree.sources" >/dev/null
fi
echo "model_deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
