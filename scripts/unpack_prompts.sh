#!/usr/bin/env bash
# Three more real speakers for choosing between models (host/data/realneg.py TRANSLATED,
# scripts/curve_variants.py): Debian's asterisk-prompt-es-co (GPL-2), asterisk-prompt-fr-armelle
# (GPL-2+) and asterisk-prompt-it-menardi-wav (CC-BY-SA-3.0), ~43 minutes together, downloaded from
# the Debian archive and unpacked into .cache/asterisk-prompts/<package>/, one folder each.
# Not installed: apt would remove asterisk-core-sounds-es and -fr for them, whose transcripts
# bench kws_base reads. Idempotent: a second run only checks.
#   usage: scripts/unpack_prompts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${EDGELEARN_ASTERISK_PROMPTS:-.cache/asterisk-prompts}"
pkgs=(asterisk-prompt-es-co asterisk-prompt-fr-armelle asterisk-prompt-it-menardi-wav)
todo=()
for p in "${pkgs[@]}"; do [ -d "$dest/$p/usr/share/asterisk/sounds" ] || todo+=("$p"); done
[ ${#todo[@]} -eq 0 ] && { echo "unpack_prompts: all three are in $dest"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 777 "$tmp"  # apt-get download runs as _apt when it can
(cd "$tmp" && apt-get download "${todo[@]}" 2>/dev/null) || {
  echo "unpack_prompts: apt-get download ${todo[*]} failed; run 'sudo apt-get update' and try again" >&2; exit 1; }
for p in "${todo[@]}"; do
  mkdir -p "$dest/$p.part" && dpkg-deb -x "$tmp/${p}"_*.deb "$dest/$p.part" && mv "$dest/$p.part" "$dest/$p"
done
echo "unpack_prompts: unpacked ${todo[*]} into $dest"
