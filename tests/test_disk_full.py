"""A full disk (QA pass 3: every state-writing command, and `detect` and the agent too, ended in an
`OSError: [Errno 28]` traceback; the agent died before detecting anything because it could not
write agent.json). Now a command says so in one sentence and keeps the old state (every state file
is replaced atomically); `detect` and `device run` keep detecting and warn once. The disk fills
through ``edge.atomic.fault_hook`` (ENOSPC at the durable step of the named file), in a real
process of the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from devstate_helpers import make_keyword_clips
from edge.audio import read_wav, write_wav
from edge.device import Device

ROOT = Path(__file__).resolve().parents[1]
FULL = """
import errno, sys
import edge.atomic as A
def hook(event, path, full=sys.argv[1]):
    if event == "tmp" and path.endswith(full):
        raise OSError(errno.ENOSPC, "No space left on device")
A.fault_hook = hook
from edge.cli import main
sys.exit(main(sys.argv[2:]))
"""


def cli(full: str, *args):
    return subprocess.run([sys.executable, "-c", FULL, full, *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    c = make_keyword_clips(root / "kw", n=5)
    stream = np.concatenate([np.zeros(8000, np.int16), read_wav(c[4]), np.zeros(16000, np.int16)])
    return c, write_wav(root / "stream.wav", np.tile(stream, 3))


def test_enrol_on_a_full_disk_is_one_sentence_and_keeps_the_keywords(clips, tmp_path):
    c, _ = clips
    st = tmp_path / "st"
    Device(st).enroll("first word", c[:3])
    before = (st / "keywords.json").read_bytes()
    r = cli("keywords.json", "device", "enroll", "--state", st, "--keyword", "second word", "--wav", *c[:3])
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "no space left on the disk to write" in r.stderr, r.stderr
    said = [ln for ln in r.stderr.splitlines() if not ln.startswith("INFO: ")]  # TFLite's own line
    assert "keywords.json" in r.stderr and len(said) == 1, r.stderr
    assert (st / "keywords.json").read_bytes() == before  # the old state, whole
    assert not [p for p in st.iterdir() if p.name.endswith(".tmp")]


def test_detect_and_the_agent_keep_detecting_on_a_full_disk(clips, tmp_path):
    c, stream = clips
    st = tmp_path / "st"
    Device(st).enroll("first word", c[:4])
    # detect: the tail replay buffer cannot be written (its last write, on the way out, makes the file)
    r = cli("replay_tail.bin", "device", "detect", "--state", st, "--wav", stream)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.count("first word") == 3, r.stdout
    assert r.stderr.count("cannot save") == 1 and "no space left on the disk" in r.stderr, r.stderr
    r = cli("agent.json", "device", "run", "--state", st, "--wav", stream)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("cannot save agent.json (no space left on the disk)") == 1, r.stderr
    assert sum(1 for line in r.stdout.splitlines() if "first word" in line) == 3, r.stdout
    assert not (st / "agent.json").exists() or json.loads((st / "agent.json").read_text())
