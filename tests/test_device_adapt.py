"""``edgelearn device adapt`` trains the conv tail on the int8 backbone (feature cache, replay);
``device detect`` then runs backbone + adapted tail, and feeds confirmed detections to replay."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from edge.audio import write_wav
from edge.portable.replay import ReplayBuffer

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")
WORDS = ["yes", "stop", "left"]


def cli(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "edge.cli", "device", *map(str, args)],
                       capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(r.stderr)
    return r


@pytest.fixture(scope="module")
def audio():
    from host.data import noise, synth
    from host.data.corpus import CorpusConfig, assign_splits

    split = assign_splits(synth.all_voices(), CorpusConfig())
    voices = [v for v in synth.all_voices() if split[v.id] == "test" and v.synth == "espeak"][:3]
    clips = {w: synth.render(voices[0], [(w, r, 1.0) for r in (0.9, 1.0, 1.1)]) for w in WORDS}
    rng = np.random.default_rng(3)
    parts = []
    for w in WORDS * 2:
        [u] = synth.render(voices[1], [(w, 1.0, 1.0)])
        parts += [np.zeros(int(rng.uniform(0.7, 1.0) * 16000), np.float32), u.astype(np.float32)]
    parts.append(np.zeros(16000, np.float32))
    long = np.concatenate(parts)
    long += noise.coloured_noise(rng, "pink", (len(long),)) * 100
    return clips, np.clip(long, -32768, 32767).astype(np.int16)


def test_adapt_trains_the_conv_tail_and_detect_uses_it(audio, tmp_path):
    clips, long = audio
    data, st = tmp_path / "data", tmp_path / "st"
    for w, cs in clips.items():
        for i, c in enumerate(cs):
            (data / w).mkdir(parents=True, exist_ok=True)
            write_wav(data / w / f"{i}.wav", c)
    out = cli("adapt", "--state", st, "--data", data, "--strategy", "bias-only", "--steps", "6", "--force",
              "--context", "kitchen")
    res = json.loads(out.stdout)
    # bias-only freezes dw4 by default (--dw4 auto): its forward starts after pw4, once per clip
    assert res["status"] == "done" and res["tensors"] == ["pw4_b", "cls_b"]
    assert res["step_bytes"] > 0
    saved = np.load(st / "adapt" / "kitchen" / "v1.npz")
    assert {"pw4_b", "cls_b"} <= set(saved.files) and "dw4_b" not in saved.files
    [cache] = (st / "adapt").glob("features-*.npy")
    x = np.load(cache)
    assert x.dtype == np.int8 and x.shape == (9, 25, 5, 64)
    stamp = cache.stat().st_mtime_ns
    cli("adapt", "--state", st, "--data", data, "--strategy", "lora", "--steps", "3", "--force",
        "--context", "kitchen")
    assert cache.stat().st_mtime_ns == stamp  # the second run read the cache, no backbone rerun
    res = json.loads(cli("adapt", "--state", st, "--data", data, "--strategy", "bias-only", "--dw4", "train",
                         "--steps", "3", "--force", "--context", "hall").stdout)
    assert res["tensors"] == ["dw4_b", "pw4_b", "cls_b"]
    # every strategy's delta saves and loads again, the depthwise kernel (3, 3, 64) of `full` included
    for strategy in ("full", "residual-adapter", "sparse"):
        res = json.loads(cli("adapt", "--state", st, "--data", data, "--strategy", strategy, "--steps", "2",
                             "--force", "--context", strategy).stdout)
        assert res["status"] == "done", res
        saved = np.load(st / "adapt" / strategy / "v1.npz")
        assert set(res["tensors"]) <= set(saved.files)
    assert np.load(st / "adapt" / "full" / "v1.npz")["dw4_w"].shape == (3, 3, 64)
    cli("adapt", "--state", st, "--use", "hall")  # detect below runs the context it ran before
    bad = cli("adapt", "--state", st, "--data", data, "--distill", "1.5", "--force", check=False)
    assert bad.returncode != 0 and "argument --distill: 1.5 is outside 0..1" in bad.stderr and "Traceback" not in bad.stderr
    assert (st / "adapt" / "kitchen" / "v2.npz").exists() and not (st / "adapt" / "kitchen" / "v3.npz").exists()
    rb = ReplayBuffer.from_bytes((st / "replay_tail.bin").read_bytes())
    assert rb.dim == 25 * 5 * 64 and sum(rb.class_counts().values()) == rb.count >= 9
    wav = write_wav(tmp_path / "long.wav", long)
    events = [json.loads(ln) for ln in cli("detect", "--state", st, "--wav", wav, "--json",
                                           "--no-replay").stdout.splitlines()]
    assert [e["keyword"] for e in events] == WORDS * 2  # backbone + adapted tail still detects
    status = json.loads(cli("status", "--state", st).stdout)
    assert status["adapt"]["contexts"]["kitchen"]["current"] == 2
    assert status["replay"]["replay_tail.bin"]["count"] == rb.count


def test_confirmed_detections_feed_the_replay_buffer(audio, tmp_path):
    _, long = audio
    wav = write_wav(tmp_path / "long.wav", long)
    st = tmp_path / "st"
    none = cli("detect", "--state", st, "--wav", wav, "--json", "--no-replay")
    assert none.stdout and not (st / "replay_tail.bin").exists()
    events = [json.loads(ln) for ln in cli("detect", "--state", st, "--wav", wav, "--json",
                                           "--confirm", "0.8").stdout.splitlines()]
    confirmed = [e["keyword"] for e in events if e["score"] >= 0.8]
    assert confirmed, events
    rb = ReplayBuffer.from_bytes((st / "replay_tail.bin").read_bytes())
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, default_trusted_keys

    labels = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys()).labels
    got = {labels[k]: n for k, n in rb.class_counts().items()}
    want = {w: confirmed.count(w) for w in set(confirmed)}
    assert got == want
    # the strictest confirmation (scores are probabilities: --confirm is in [0, 1]) adds only certain events
    strict = [json.loads(ln) for ln in cli("detect", "--state", st, "--wav", wav, "--json",
                                           "--confirm", "1").stdout.splitlines()]
    added = sum(e["score"] >= 1.0 for e in strict if e["keyword"] in labels)
    assert ReplayBuffer.from_bytes((st / "replay_tail.bin").read_bytes()).count == rb.count + added
    assert cli("detect", "--state", st, "--wav", wav, "--confirm", "1.01", check=False).returncode == 2
