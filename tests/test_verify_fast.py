"""The custom-keyword second stage's fast path (issue 17, CPU, 2026-12-02): the same distances and
decisions as the straightforward one it replaced, which this file keeps as the reference.

The fast path: templates turned into unit vectors once per keyword (``Verifier.prepare``), every
template aligned in one ``sdtw_batch``, and the noise-range percentile skipped when the distance is
clear of every threshold the keyword's levels can give (``CustomKeywords._passes``)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from edge import features as F
from edge import verify as V
from edge.bundle import load_bundle
from edge.detect import Detector, detect_pcm
from edge.enroll import CustomKeywords, DeviceState, enroll
from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys

RATES = ((0.9, 1.0), (1.0, 0.95), (1.1, 1.05), (0.95, 1.1), (1.05, 0.9), (1.0, 1.0), (0.97, 1.03), (1.03, 0.97))


def ref_sdtw(tpl, seqs, limit_speedup=True):
    """``edge.verify.sdtw`` as the runtime ran it, one template at a time (a copy, so a change there
    cannot move the reference with it)."""
    cost = 1.0 - np.einsum("md,knd->kmn", tpl, seqs)
    moved = cost[:, 0].copy()
    stayed = np.full_like(moved, np.inf)
    for i in range(1, len(tpl)):
        prev = np.minimum(moved, stayed)
        best = np.full_like(moved, np.inf)
        best[:, 1:] = prev[:, :-1]
        np.minimum(best[:, 2:], prev[:, :-2], out=best[:, 2:])
        stayed = cost[:, i] + (moved if limit_speedup else prev)
        moved = cost[:, i] + best
    return np.minimum(moved, stayed).min(axis=1) / len(tpl)


def ref_verify(custom: CustomKeywords, k: int, feats: np.ndarray) -> tuple[bool, float]:
    """``CustomKeywords.verify`` as it was: every template made unit vectors at every window and
    aligned on its own, the threshold always interpolated at the window's noise range."""
    ver, v = custom.verifier, custom.verify_versions[k]
    seqs = ver.sequences(feats[None], v)
    d = float(np.min([ref_sdtw(ver.unit(t, v), seqs, v >= 2) for t in custom.templates[k]], axis=0)[0])
    levels = custom.verify_levels[k]
    return d <= (custom.verify_thresholds[k] if levels is None else float(V.threshold_at(levels, feats, v))), d


class Straightforward:
    """A CustomKeywords whose second stage is the reference."""

    def __init__(self, custom):
        self._custom = custom

    def __getattr__(self, name):
        return getattr(self._custom, name)

    def verify(self, k, feats):
        return ref_verify(self._custom, k, np.asarray(feats))


class Checked:
    """The fast CustomKeywords, every window it checks also decided by the reference (recorded)."""

    def __init__(self, custom):
        self._custom, self.checked = custom, []

    def __getattr__(self, name):
        return getattr(self._custom, name)

    def verify(self, k, feats):
        got = self._custom.verify(k, feats)
        self.checked.append((got, ref_verify(self._custom, k, np.asarray(feats))))
        return got


@pytest.fixture(scope="module")
def km():
    return KeywordModel(load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys()))


@pytest.fixture(scope="module")
def voice():
    from host.data import synth

    return synth.Voice("flite", "rms")


@pytest.fixture(scope="module")
def clips(voice):
    from host.data import synth

    return synth.render(voice, [("hey robot", r, p) for r, p in RATES])


@pytest.fixture(scope="module")
def entry(km, clips, tmp_path_factory):
    d = tmp_path_factory.mktemp("state")
    enroll(km, DeviceState.open(d, km.bundle), "hey robot", clips[:5])
    return json.loads((d / "keywords.json").read_text())["keywords"][0]


def at_version(entry: dict, version: int, name: str) -> dict:
    """The entry as a version-``version`` runtime enrolled it: the steps cut to that version's parts,
    one threshold before version 4."""
    dim = 320 if version < 3 else 320 + V.MFCC_DIM if version < 5 else entry["verify"]["dim"]
    tpl = [t[:, :dim] for t in V.unpack(entry["verify"])]
    v = dict(entry["verify"], version=version, dim=dim,
             templates=base64.b64encode(np.concatenate(tpl).tobytes()).decode())
    if version < 4:
        v.pop("levels")
    return dict(entry, name=name, verify=v)


@pytest.fixture(scope="module")
def stream(voice, clips):
    """Held-out renders clean and in white noise at 10 dB, their halves swapped, other words."""
    from host.data import synth

    others = synth.render(voice, [("robot hey", 1.0, 1.0), ("hey", 1.0, 1.0), ("hey robin", 1.0, 1.0),
                                  ("a red boat", 1.0, 1.0)])
    rng = np.random.default_rng(5)
    parts = []
    for c in list(clips[5:]) + others:
        parts += [np.zeros(12000, np.float32), c.astype(np.float32)]
    for c in clips[5:]:
        c = c.astype(np.float32)
        noisy = c + rng.standard_normal(c.size).astype(np.float32) * np.sqrt((c ** 2).mean() / 10)
        half = len(c) // 2
        parts += [np.zeros(12000, np.float32), noisy, np.zeros(12000, np.float32),
                  np.concatenate([c[half:], c[:half]])]
    x = np.concatenate(parts + [np.zeros(16000, np.float32)])
    x += rng.standard_normal(x.size).astype(np.float32) * 30
    return np.clip(x, -32768, 32767).astype(np.int16)


def test_sdtw_batch_is_sdtw_template_by_template():
    rng = np.random.default_rng(0)
    for _ in range(150):
        d = int(rng.choice([6, 320, 446]))
        lens = rng.integers(1, 26, size=int(rng.integers(1, 8)))
        tpls = [t / np.linalg.norm(t, axis=1, keepdims=True)
                for t in (rng.standard_normal((m, d)).astype(np.float32) for m in lens)]
        seqs = rng.standard_normal((int(rng.integers(1, 4)), int(rng.integers(1, 30)), d)).astype(np.float32)
        seqs /= np.linalg.norm(seqs, axis=-1, keepdims=True)
        for limit in (True, False):
            got = V.sdtw_batch(tpls, seqs, limit)
            want = np.stack([ref_sdtw(t, seqs, limit) for t in tpls])
            assert got.dtype == want.dtype and np.array_equal(got, want)   # the same bits, not close
    with pytest.raises(ValueError):
        V.sdtw_batch([], seqs)


def windows_of(km, pcm, hop=4):
    """Normalised 1 s windows of a stream every ``hop`` frames, as the detector makes them."""
    frames = np.array(F.MfccStream().push(pcm))
    return [F.normalize(frames[i:i + F.N_FRAMES], km.scale) for i in range(0, len(frames) - F.N_FRAMES + 1, hop)]


def test_distances_and_decisions_equal_the_reference_for_every_version(km, entry, stream):
    """Every window of the stream, keywords of verifier versions 1 (free speed-up), 3 (one threshold),
    4 (levels, no phones), 8 (noise range from the median frame) and 7 (from the 10th percentile):
    the same distance to the bit, the same decision."""
    entries = [at_version(entry, v, f"v{v}") for v in (1, 3, 4, 8)] + [entry]
    custom = CustomKeywords(entries, km.bundle)
    assert custom.verify_versions == [1, 3, 4, 8, 7]
    wins = windows_of(km, stream)[::4]
    assert len(wins) >= 50
    passed = {k: 0 for k in range(5)}
    for k in range(5):
        ref = [ref_verify(custom, k, w) for w in wins]
        for w, want in zip(wins, ref):
            assert custom.verify(k, w) == want
            passed[k] += want[0]
    assert all(0 < n < len(wins) for n in passed.values()), passed   # both decisions were exercised


def test_detector_events_equal_the_straightforward_second_stage(km, entry, stream):
    custom = CustomKeywords([entry], km.bundle)
    checked = Checked(custom)
    a = Detector(km, custom=checked, keywords=[])
    b = Detector(km, custom=Straightforward(custom), keywords=[])
    got, want = detect_pcm(a, stream), detect_pcm(b, stream)
    assert got == want and a.rejected == b.rejected          # keyword, time_s and score of every event
    assert got and a.rejected >= 1                           # candidates both passed and rejected
    assert a.verified == b.verified == len(checked.checked)
    assert a.verified > len(got) + a.rejected                # searches of several windows ran
    assert all(fast == ref for fast, ref in checked.checked)


def test_the_threshold_shortcut_decides_as_the_interpolated_threshold(km, entry, stream):
    custom = CustomKeywords([entry], km.bundle)
    levels = custom.verify_levels[0]
    lo, hi = min(t for _, t in levels), max(t for _, t in levels)
    assert lo < hi
    wins = windows_of(km, stream)[::7]
    for w in wins:
        thr = float(V.threshold_at(levels, w, custom.verify_versions[0]))
        for d in (lo - 1e-3, lo - 2e-9, lo, np.nextafter(thr, -1), thr, np.nextafter(thr, 2), hi,
                  hi + 2e-9, hi + 1e-3, 0.0, 2.0):
            assert custom._passes(0, float(d), w) == (float(d) <= thr)
    # a window whose loudness is not finite has a NaN threshold: nothing passes it, as before
    bad = wins[0].copy()
    bad[3, 0] = np.nan
    assert not custom._passes(0, lo - 1.0, bad) and not (lo - 1.0 <= float(V.threshold_at(levels, bad, custom.verify_versions[0])))
