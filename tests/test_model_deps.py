"""scripts/model_deps.sh (what `make model` needs beyond set-up) with stand-ins for dpkg-query,
apt-cache, apt-get and sudo (no network or root in tests): nothing to do when everything is
installed; the missing packages installed when the engines are installable; Debian's `contrib
non-free` source written first when they are not; elsewhere one sentence naming the fix."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKGS = ["rhvoice", "rhvoice-english", "libttspico-utils", "asterisk-core-sounds-fr-wav", "asterisk-core-sounds-it-wav"]


@pytest.fixture
def run(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "apt.log"
    (bin_ / "dpkg-query").write_text('#!/bin/sh\nfor p in $INSTALLED; do [ "$p" = "$3" ] && '
                                     'printf "install ok installed" && exit 0; done\nexit 1\n')
    (bin_ / "apt-cache").write_text('#!/bin/sh\nfor p in rhvoice libttspico-utils; do echo "$p:"; '
                                    'echo "  Candidate: ${CANDIDATE:-(none)}"; done\n')
    (bin_ / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_ / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    (tmp_path / "sources").mkdir()

    def go(installed=(), candidate=None, os_id="debian"):
        (tmp_path / "os-release").write_text(f"ID={os_id}\nVERSION_CODENAME=bookworm\n")
        env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "INSTALLED": " ".join(installed),
               "EDGELEARN_OS_RELEASE": str(tmp_path / "os-release"),
               "EDGELEARN_APT_SOURCES": str(tmp_path / "sources")}
        if candidate:
            env["CANDIDATE"] = candidate
        r = subprocess.run(["bash", str(ROOT / "scripts" / "model_deps.sh")], env=env, capture_output=True, text=True)
        calls = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return r, calls, sorted(p.name for p in (tmp_path / "sources").iterdir())
    return go


def test_nothing_to_do_when_everything_is_installed(run):
    r, calls, sources = run(installed=PKGS)
    assert r.returncode == 0 and "are installed" in r.stdout and calls == [] and sources == []


def test_installable_engines_are_installed_without_a_new_source(run):
    r, calls, sources = run(installed=PKGS[:2], candidate="1.8.0-1")
    assert r.returncode == 0 and sources == []
    assert calls == ["update -qq", "install -y -qq " + " ".join(PKGS[2:])]


def test_debian_without_non_free_gets_the_source_first(run, tmp_path):
    r, calls, sources = run()
    assert r.returncode == 0, r.stderr
    assert sources == ["edgelearn-nonfree.sources"]
    text = (tmp_path / "sources" / "edgelearn-nonfree.sources").read_text()
    assert "Suites: bookworm" in text and "Components: contrib non-free" in text
    assert calls == ["update -qq", "install -y -qq " + " ".join(PKGS)]


def test_elsewhere_one_sentence_names_the_fix_and_nothing_is_installed(run):
    r, calls, sources = run(os_id="ubuntu")
    assert r.returncode == 1 and calls == [] and sources == []
    assert r.stderr.strip().count("\n") == 0 and "non-free (Ubuntu: multiverse)" in r.stderr
