"""Custom keywords across model versions (issue 18): ``Device.carry_to`` keeps them when the new
version learned nothing new for them, and enrols them again on the device from the clips it kept
(``Device.enroll`` stores them in the state, never uploaded) when the encoder's side changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from devstate_helpers import make_keyword_clips

from edge.audio import read_wav
from edge.bundle import load_bundle
from edge.device import ENROLMENT_DIR, Device
from edge.errors import EdgelearnError

ROOT = Path(__file__).resolve().parents[1]
KW = "hey edge"


def stream(clip) -> np.ndarray:
    """Noise with the keyword said three times (tests/test_wyoming.py's stream)."""
    rng = np.random.default_rng(8)
    noise = lambda n: rng.standard_normal(n) * 100  # noqa: E731
    return np.concatenate([noise(16000), clip, noise(40000), clip, noise(40000), clip, noise(16000)]).astype(np.int16)


def new_version(tmp: Path, version: int, change_negatives: bool):
    """The shipped bundle as ``version``, signed with a test key; with ``change_negatives`` its
    negative bank (part of what a keyword is enrolled with) differs."""
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
    res = Device(st).carry_to(new_version(tmp_path, 2, change_negatives=False))
    assert res == {"keywords": 1, "contexts": 0, "rederived": []}
    after = json.loads((st / "keywords.json").read_text())
    assert after["model_version"] == 2 and after["keywords"] == before


def test_a_new_negative_bank_enrols_the_keyword_again_from_the_kept_clips(enrolled, tmp_path):
    st, clips = enrolled
    kept = Device(st).enrolment_clips(KW)
    assert kept is not None and len(kept) == len(clips)
    assert all(np.array_equal(k, read_wav(c, min_samples=1)) for k, c in zip(kept, clips))
    before = json.loads((st / "keywords.json").read_text())["keywords"][0]
    pcm = stream(read_wav(clips[0]))
    assert [e["keyword"] for e in Device(st).detect(pcm, replay=False)] == [KW] * 3
    new = new_version(tmp_path, 2, change_negatives=True)
    res = Device(st).carry_to(new)
    assert res["rederived"] == [KW] and res["keywords"] == 1
    doc = json.loads((st / "keywords.json").read_text())
    assert doc["model_version"] == 2 and doc["keywords"][0]["name"] == KW
    assert doc["keywords"][0]["threshold"] != before["threshold"] or doc["keywords"][0]["w"] != before["w"]
    assert not list(st.glob(".rederive-*"))  # the scratch state is gone
    assert [e["keyword"] for e in Device(st, new).detect(pcm, replay=False)] == [KW] * 3


def test_without_kept_clips_a_new_basis_is_refused_and_nothing_changes(enrolled, tmp_path):
    st, _ = enrolled
    shutil.rmtree(st / ENROLMENT_DIR)  # enrolled before clips were kept
    before = (st / "keywords.json").read_bytes()
    new = new_version(tmp_path, 2, change_negatives=True)
    with pytest.raises(EdgelearnError, match="no kept enrolment clips for hey edge"):
        Device(st).carry_to(new)
    assert (st / "keywords.json").read_bytes() == before
