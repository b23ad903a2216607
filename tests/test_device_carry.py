"""Custom keywords across model versions (issue 18): ``Device.carry_to`` keeps them when the new
version learned nothing new for them, and enrols them again on the device from the clips it kept
(``Device.enroll`` stores them in the state, never uploaded) when the encoder's side changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from aggregator_helpers import BASE_VERSION
from devstate_helpers import make_keyword_clips

from edge.audio import read_wav
from edge.bundle import load_bundle
from edge.device import ENROLMENT_DIR, Device
from edge.errors import EdgelearnError

ROOT = Path(__file__).resolve().parents[1]
KW = "hey edge"
NEW = BASE_VERSION + 1  # the version each test carries to: the one after the shipped bundle's


def stream(clip) -> np.ndarray:
    """Noise with the keyword said three times (tests/test_wyoming.py's stream)."""
    rng = np.random.default_rng(8)
    noise = lambda n: rng.standard_normal(n) * 100  # noqa: E731
    return np.concatenate([noise(16000), clip, noise(40000), clip, noise(40000), clip, noise(16000)]).astype(np.int16)


def new_version(tmp: Path, version: int, change_negatives: bool, change_encoder: bool = False):
    """The shipped bundle as ``version``, signed with a test key; with ``change_negatives`` its
    negative bank (part of what a keyword is enrolled with) differs; with ``change_encoder`` the
    bytes of one of its encoders do (trailing bytes the flatbuffer ignores: it still runs)."""
    from host.bundle import sign_bundle
    from host.keys import generate_keypair

    keys = tmp / "keys"
    if not (keys / "rel.key").exists():
        generate_keypair(keys, "rel")
    b = tmp / f"v{version}"
    shutil.copytree(ROOT / "models" / "kws-dscnn-s", b)
    (b / "manifest.sig").unlink()
    m = json.loads((b / "manifest.json").read_text())
    m["version"] = version
    (b / "manifest.json").write_text(json.dumps(m))
    if change_negatives:
        bank = np.load(b / "negatives.npy")
        np.save(b / "negatives.npy", bank[: len(bank) - 40])
    if change_encoder:
        with open(b / "encoder_fp32.tflite", "ab") as f:
            f.write(b"\0" * 16)
    sign_bundle(b, keys / "rel.key", refresh=True)
    return load_bundle(b, trusted_keys=keys / "rel.pub")


@pytest.fixture()
def enrolled(tmp_path):
    clips = make_keyword_clips(tmp_path / "clips")
    st = tmp_path / "st"
    Device(st).enroll(KW, clips)
    return st, clips


def test_unchanged_basis_carries_the_keyword_as_it_is(enrolled, tmp_path):
    st, _ = enrolled
    before = json.loads((st / "keywords.json").read_text())["keywords"]
    res = Device(st).carry_to(new_version(tmp_path, NEW, change_negatives=False))
    assert res == {"keywords": 1, "contexts": 0, "rederived": [], "voices_dropped": []}
    after = json.loads((st / "keywords.json").read_text())
    assert after["model_version"] == NEW and after["keywords"] == before


def test_a_new_negative_bank_enrols_the_keyword_again_from_the_kept_clips(enrolled, tmp_path):
    st, clips = enrolled
    kept = Device(st).enrolment_clips(KW)
    assert kept is not None and len(kept) == len(clips)
    assert all(np.array_equal(k, read_wav(c, min_samples=1)) for k, c in zip(kept, clips))
    before = json.loads((st / "keywords.json").read_text())["keywords"][0]
    pcm = stream(read_wav(clips[0]))
    assert [e["keyword"] for e in Device(st).detect(pcm, replay=False)] == [KW] * 3
    new = new_version(tmp_path, NEW, change_negatives=True)
    res = Device(st).carry_to(new)
    assert res["rederived"] == [KW] and res["keywords"] == 1
    doc = json.loads((st / "keywords.json").read_text())
    assert doc["model_version"] == NEW and doc["keywords"][0]["name"] == KW
    assert doc["keywords"][0]["threshold"] != before["threshold"] or doc["keywords"][0]["w"] != before["w"]
    assert not list(st.glob(".rederive-*"))  # the scratch state is gone
    assert [e["keyword"] for e in Device(st, new).detect(pcm, replay=False)] == [KW] * 3


def test_without_kept_clips_a_new_basis_is_refused_and_nothing_changes(enrolled, tmp_path):
    st, _ = enrolled
    shutil.rmtree(st / ENROLMENT_DIR)  # enrolled before clips were kept
    before = (st / "keywords.json").read_bytes()
    new = new_version(tmp_path, NEW, change_negatives=True)
    with pytest.raises(EdgelearnError, match="no kept enrolment clips for hey edge"):
        Device(st).carry_to(new)
    assert (st / "keywords.json").read_bytes() == before



CARRY_CHILD = """
import sys
from edge.bundle import load_bundle
from edge.device import Device
st, new_dir, pub = sys.argv[1:4]
Device(st).carry_to(load_bundle(new_dir, trusted_keys=pub))
"""


def kill_carry_half_way(st: Path, new, pub: Path, held: Path) -> None:
    """``Device(st).carry_to(new)`` in a child process, kill -9 at its hold point (the adapt pointer
    written, the keywords not)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from edge.device import HOLD_CARRY_ENV

    held.unlink(missing_ok=True)
    env = {**os.environ, HOLD_CARRY_ENV: str(held), "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", CARRY_CHILD, str(st), str(new.root), str(pub)], env=env)
    try:
        for _ in range(1200):
            if held.exists() or p.poll() is not None:
                break
            time.sleep(0.1)
        assert held.exists(), f"the carry never reached its hold point (rc {p.poll()})"
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait()


def test_a_carry_killed_between_its_two_writes_finishes_on_the_next_call_or_is_undone(enrolled, tmp_path):
    """kill -9 after the adapt pointer moved and before the keywords did: each file is old or new;
    the next carry_to (what the agent runs on restart) finishes the move, and a version refused
    after all gets the pointer back (``unbind_adapted``, the agent's rollback)."""
    from edge.adapt.store import AdaptStore

    st, clips = enrolled
    rng = np.random.default_rng(1)
    w, y = (rng.standard_normal((4, 16000)) * 2000).astype(np.int16), ["yes", "yes", "stop", "stop"]
    assert Device(st).adapt((w, y), steps=2, force=True)["status"] == "done"
    old = Device(st).bundle
    new = new_version(tmp_path, NEW, change_negatives=False)
    pub, held = tmp_path / "keys" / "rel.pub", tmp_path / "held"
    pcm = stream(read_wav(clips[0]))

    def bound() -> tuple[int, int]:
        return (json.loads((st / "adapt" / "active.json").read_text())["model"][1],
                json.loads((st / "keywords.json").read_text())["model_version"])

    kill_carry_half_way(st, new, pub, held)
    assert bound() == (NEW, old.version)
    with pytest.raises(EdgelearnError, match="trained on bundle"):
        AdaptStore(st, old)  # what the old version would find: the reason the agent undoes it
    Device(st).unbind_adapted(new)  # the version is refused: back on the running one
    assert bound() == (old.version, old.version) and AdaptStore(st, old).meta["contexts"]
    assert [e["keyword"] for e in Device(st).detect(pcm, replay=False)] == [KW] * 3

    kill_carry_half_way(st, new, pub, held)
    res = Device(st).carry_to(new)  # the restart: finishes what the killed one began
    assert res["keywords"] == 1 and res["contexts"] == 1 and bound() == (NEW, NEW)
    assert AdaptStore(st, new).meta["contexts"]
    assert [e["keyword"] for e in Device(st, new).detect(pcm, replay=False)] == [KW] * 3
