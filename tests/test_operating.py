"""Operating points: per-keyword thresholds from false accepts per hour, and the Detector that uses them;
the base-command bench's reading rules (real-speech split and transcripts, hits, false accepts)."""

import numpy as np
import pytest

from bench import _base_streams as B
from bench import _realspeech as R
from edge import features as F
from edge.detect import THRESHOLD, Detector, count_events
from edge.errors import EdgelearnError
from edge.operating import GRID, OperatingPoints, calibrate, stream_scores


def _series(peaks, n=400):
    """One keyword's scores: isolated bumps of the given heights, 20 runs apart."""
    s = np.zeros(n)  # float64: a float32 0.95 sits under the grid's 0.95
    for i, h in enumerate(peaks):
        s[20 + 20 * i: 23 + 20 * i] = h
    ends = np.stack([np.arange(n) * 0.08 + 1.0] * 2, axis=1)
    return s, ends


def test_calibrate_takes_the_lowest_threshold_within_each_keywords_share_of_the_rate():
    a, ends = _series([0.95, 0.6, 0.55])      # keyword 0 fires at three heights
    b, _ = _series([0.3])                      # keyword 1 barely moves
    scores = np.stack([a, b], axis=1)
    hours = 1.0
    # a share of 0.5 FA/h per keyword allows no event at all: above the highest bump
    cal = calibrate([(scores, ends, None)], hours, 1.0, ["x", "y"])
    assert cal["thresholds"]["x"] == 0.96 and cal["fa_h"]["x"] == 0.0
    assert cal["thresholds"]["y"] == 0.31 and cal["fa_h"]["y"] == 0.0
    # 2 events per hour per keyword allowed: the threshold may sit under the two lower bumps' top
    cal = calibrate([(scores, ends, None)], hours, 4.0, ["x", "y"])
    assert cal["thresholds"]["x"] == 0.56 and cal["fa_h"]["x"] == 2.0
    assert count_events(a, cal["thresholds"]["x"], ends) <= 2
    # events the stream is allowed to have (it says the keyword there) do not count
    cal = calibrate([(scores, ends, lambda k, t: k == 0)], hours, 1.0, ["x", "y"])
    assert cal["thresholds"]["x"] == GRID[0]


def test_calibrate_refuses_an_empty_stream_and_points_pick_the_rate_at_or_under_the_one_asked():
    with pytest.raises(EdgelearnError):
        calibrate([], 0.0, 0.5, ["x"])
    table = OperatingPoints({"points": [{"target_fa_h": 2.0, "thresholds": {"yes": 0.5}},
                                        {"target_fa_h": 0.5, "thresholds": {"yes": 0.8}}]})
    assert table.thresholds(0.5) == {"yes": 0.8} and table.thresholds(1.0) == {"yes": 0.8}
    assert table.thresholds(5) == {"yes": 0.5}
    with pytest.raises(EdgelearnError):
        table.thresholds(0.1)
    with pytest.raises(EdgelearnError):
        OperatingPoints({"points": []})


class _Scripted:
    """A keyword model whose 'yes' posterior follows a script, one value per encoder run."""

    labels = ["yes", "no", "_silence_", "_unknown_"]
    scale = np.ones(10, np.float32)

    def __init__(self, script):
        self.script, self.i = list(script), 0

    def infer(self, feats):
        n = len(feats)
        p = np.zeros((n, 4), np.float32)
        for j in range(n):
            p[j, 0] = self.script[min(self.i, len(self.script) - 1)]
            self.i += 1
        p[:, 3] = 1 - p[:, 0]
        return np.zeros((n, 64), np.float32), p


def test_detector_takes_thresholds_per_keyword_and_stream_scores_are_what_it_sees():
    pcm = (np.random.default_rng(0).standard_normal(16000 * 4) * 300).astype(np.int16)
    script = [0.0] * 10 + [0.65] * 4 + [0.0] * 60
    fixed = Detector(_Scripted(script), keywords=["yes", "no"])
    assert fixed.thresholds.tolist() == pytest.approx([THRESHOLD, THRESHOLD])
    assert [e for c in range(0, len(pcm), 1600) for e in fixed.push(pcm[c:c + 1600])] == []
    low = Detector(_Scripted(script), keywords=["yes", "no"], threshold={"yes": 0.6})
    assert low.thresholds.tolist() == pytest.approx([0.6, THRESHOLD])
    events = [e for c in range(0, len(pcm), 1600) for e in low.push(pcm[c:c + 1600])] + low.flush()
    assert [e["keyword"] for e in events] == ["yes"]
    with pytest.raises(EdgelearnError):
        Detector(_Scripted(script), keywords=["yes"], threshold={"stop": 0.5})
    scores, ends, hours = stream_scores(Detector(_Scripted(script), keywords=["yes", "no"]), pcm)
    assert scores.shape == (len(range(49, 199 + 1, 4)), 2) and hours == pytest.approx(4 / 3600)
    assert scores[10:14, 0].tolist() == pytest.approx([0.65] * 4)
    assert count_events(scores[:, 0], 0.6, ends, times=(t := [])) == 1 and t == [events[0]["time_s"]]


def test_real_speech_split_is_by_name_and_a_prompt_says_a_keyword_only_as_a_word():
    assert R.split("digits/yesterday") == R.split("digits/yesterday")
    names = list(R.transcripts())
    halves = [R.split(n) for n in names]
    assert 0.4 < halves.count("dev") / len(halves) < 0.6
    p = R.Prompt("x", "", R.spoken_words("Press 1 to hang up; yesterday's menu, left brace."), "dev", np.zeros(1))
    assert p.says("one") and p.says("up") and p.says("left") and not p.says("yes") and not p.says("two")
    assert R.spoken_words("dial 1234") == ("dial", "one", "two", "three", "four")
    assert not R.is_speech("[ascending tones]") and not R.is_speech("(10 seconds of silence)")
    assert R.is_speech("Agent logged in.")


def test_positive_hits_and_real_speech_false_accepts_are_counted_by_the_rules():
    clips = [B.Clip("v", "yes", np.zeros(8000, np.int16)), B.Clip("v", "stop", np.zeros(8000, np.int16))]
    spans = [(1.5, 2.0), (3.5, 4.0)]
    events = [{"keyword": "yes", "time_s": 2.1}, {"keyword": "go", "time_s": 3.6}]
    r = B.score_positives(events, spans, clips)
    assert r["recall"] == 0.5 and r["per_word"] == {"yes": 1.0, "stop": 0.0} and r["substitutions"] == 1
    assert "by_noise" not in r and B.score_positives(events, spans, clips, noisy=True)["by_noise"] == \
        {"white": 1.0, "pink": 0.0}            # clip i under COLOURS[i % 3], as positive_stream mixes it
    four = B.score_positives([{"keyword": "yes", "time_s": t} for t in (1.0, 5.4)], [(1, 1.5), (2, 2.5), (3, 3.5),
                             (4, 4.5)], [B.Clip("v", "yes", np.zeros(1))] * 4, noisy=True)
    assert four["by_noise"] == {"white": 1.0, "pink": 0.0, "babble": 0.0}
    prompts = [R.Prompt("a", "", ("yesterday",), "test", np.zeros(1)),
               R.Prompt("b", "", ("logged", "on"), "test", np.zeros(1))]
    fa = B.false_accepts([{"keyword": "yes", "time_s": 0.5}, {"keyword": "on", "time_s": 2.5}],
                         [(0.0, 1.0), (2.0, 3.6)], prompts)
    assert fa["fa"] == 1 and fa["examples"][0]["prompt"] == "a"
    assert fa["in_sentence_found"] == 1 and fa["in_sentence_said"] == 1
    assert fa["fa_per_hour"] == pytest.approx(1 / (3.6 / 3600))
    assert B.refractory([{"keyword": "no", "time_s": t} for t in (1.0, 1.4, 2.1, 2.5)]) == \
        [{"keyword": "no", "time_s": 1.0}, {"keyword": "no", "time_s": 2.1}]


def test_noisy_speech_puts_noise_at_the_asked_snr_over_every_utterance_and_keeps_the_speech():
    rng = np.random.default_rng(0)
    pcm = np.zeros(16000 * 4, np.int16)
    spans = [(0.5, 1.5), (2.5, 3.5)]
    for a, b in spans:
        pcm[int(a * 16000):int(b * 16000)] = (rng.standard_normal(16000) * 3000).astype(np.int16)
    pool = [(rng.standard_normal(16000 * 3) * 1000).astype(np.float32)]
    for snr in (20, 10):
        x = B.noisy_speech(pcm, spans, snr, seed=1, pool=pool)
        assert x.shape == pcm.shape and x.dtype == np.int16
        added = x.astype(np.float64) - pcm
        gap = added[int(1.6 * 16000):int(2.4 * 16000)]          # noise between the utterances too
        p_speech = float(np.mean(pcm[8000:24000].astype(np.float64) ** 2))
        assert 10 * np.log10(p_speech / np.mean(gap ** 2)) == pytest.approx(snr, abs=1.5)
    np.testing.assert_array_equal(x, B.noisy_speech(pcm, spans, 10, seed=1, pool=pool))   # a function of its seed


def test_stream_scores_in_chunks_equal_the_whole_stream():
    pcm = (np.random.default_rng(1).standard_normal(16000 * 5) * 300).astype(np.int16)
    script = list(np.linspace(0, 1, 300))
    whole = stream_scores(Detector(_Scripted(script), keywords=["yes", "no"]), pcm)
    parts = stream_scores(Detector(_Scripted(script), keywords=["yes", "no"]),
                          (pcm[i:i + 7001] for i in range(0, len(pcm), 7001)))
    assert np.array_equal(whole[0], parts[0]) and np.array_equal(whole[1], parts[1])
    frames = 1 + (len(pcm) - F.FRAME_LENGTH) // F.HOP_LENGTH
    assert whole[2] == parts[2] and len(whole[0]) == 1 + (frames - F.N_FRAMES) // 4


@pytest.mark.skipif(__import__("shutil").which("espeak-ng") is None, reason="espeak-ng not installed")
def test_device_calibrate_then_detect_at_a_sensitivity(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from edge.audio import write_wav
    from host.data import noise, synth

    rng = np.random.default_rng(3)
    near = ["yesterday", "nowhere", "upstairs", "downtown", "leftover", "rightly", "online", "often",
            "stopwatch", "golden", "a stop sign", "go ahead and look", "nobody knows", "turn it up"]
    parts = []
    for text in near * 2:
        [u] = synth.render(synth.Voice("espeak", "en-us+f2"), [(text, float(rng.uniform(0.9, 1.1)), 1.0)])
        parts += [u.astype(np.float32), np.zeros(int(rng.uniform(0.3, 0.8) * 16000), np.float32)]
    x = np.concatenate(parts)
    x += noise.coloured_noise(rng, "pink", (len(x),)) * 60
    wav = write_wav(tmp_path / "everyday.wav", np.clip(x, -32768, 32767).astype(np.int16))
    st = tmp_path / "st"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "edge.cli", "device", *args], capture_output=True, text=True)

    r = cli("detect", "--state", str(st), "--wav", str(wav), "--sensitivity", "5", "--no-replay")
    assert r.returncode != 0 and "device calibrate" in r.stderr and "Traceback" not in r.stderr
    r = cli("calibrate", "--state", str(st), "--wav", str(wav), "--targets", "0.5,5")
    assert r.returncode == 0, r.stderr
    table = json.loads((st / "operating.json").read_text())
    assert os.stat(st / "operating.json").st_mode & 0o777 == 0o600
    assert [p["target_fa_h"] for p in table["points"]] == [0.5, 5.0]
    assert set(table["points"][0]["thresholds"]) == {"yes", "no", "up", "down", "left", "right", "on", "off",
                                                      "stop", "go"}
    assert "warning" in r.stderr  # a minute of audio pins a rate loosely, and it says so
    # on the audio it was calibrated on, the point allows less than one event: none fires
    r = cli("detect", "--state", str(st), "--wav", str(wav), "--sensitivity", "5", "--no-replay", "--json")
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout + r.stderr
    r = cli("detect", "--state", str(st), "--wav", str(wav), "--sensitivity", "0.1", "--no-replay")
    assert r.returncode != 0 and "0.5" in r.stderr and "Traceback" not in r.stderr
    # a calibration made for another model or context is refused, and so is a damaged one
    table["for"]["context"] = "kitchen"
    (st / "operating.json").write_text(json.dumps(table))
    r = cli("detect", "--state", str(st), "--wav", str(wav), "--sensitivity", "5", "--no-replay")
    assert r.returncode != 0 and "calibrate" in r.stderr and "Traceback" not in r.stderr
    (st / "operating.json").write_text('{"points": [{"target_fa_h": 1')
    r = cli("detect", "--state", str(st), "--wav", str(wav), "--sensitivity", "5", "--no-replay")
    assert r.returncode != 0 and "damaged" in r.stderr and "Traceback" not in r.stderr
    r = cli("calibrate", "--state", str(st), "--wav", str(wav), "--targets", "x")
    assert r.returncode != 0 and "--targets" in r.stderr and "Traceback" not in r.stderr


def test_a_calibration_table_with_a_threshold_out_of_range_or_too_large_is_damaged(tmp_path):
    import json

    from edge.operating import MAX_POINTS_BYTES, load_points

    for_ = {"model": "m", "bundle_version": 1, "context": None, "context_version": None}
    for bad in (1.5, True, "0.5", None):
        (tmp_path / "operating.json").write_text(json.dumps(
            {"for": for_, "points": [{"target_fa_h": 1.0, "thresholds": {"yes": bad}}]}))
        with pytest.raises(EdgelearnError, match="damaged"):
            load_points(tmp_path, for_)
    (tmp_path / "operating.json").write_text(" " * (MAX_POINTS_BYTES + 1))
    with pytest.raises(EdgelearnError, match="damaged"):
        load_points(tmp_path, for_)
    (tmp_path / "operating.json").write_text(json.dumps(
        {"for": for_, "points": [{"target_fa_h": 1.0, "thresholds": {"yes": 0.8}}]}))
    assert load_points(tmp_path, for_).thresholds(1.0) == {"yes": 0.8}


def test_matched_keeps_each_words_rate_of_a_reference():
    from edge.operating import matched

    rng = np.random.default_rng(3)
    T = 4000
    ends = np.stack([np.arange(T) * 0.08 + 1.0] * 2, axis=1)
    ref = rng.uniform(0, 0.8, (T, 2)).astype(np.float32)
    new = np.clip(ref + np.array([0.15, -0.1], np.float32), 0, 1)  # word 0 fires more, word 1 less
    counts = [count_events(ref[:, k], 0.7, ends) for k in range(2)]
    thr = matched(new, ends, counts, ["a", "b"])
    assert thr["a"] > 0.7 and thr["b"] <= 0.7
    for k, n in enumerate(["a", "b"]):
        assert count_events(new[:, k], thr[n], ends) <= counts[k]
        lower = [t for t in GRID if t < thr[n]]
        if lower:  # the lowest such threshold: one grid step down fires more often
            assert count_events(new[:, k], lower[-1], ends) > counts[k]


def test_custom_frr_splits_by_the_noise_each_clip_was_under():
    from bench import _custom_scoring as CS

    clips = [B.Clip("v", "hey jarvis", np.zeros(1))] * 6
    spans = [(k * 2.0, k * 2.0 + 0.5) for k in range(6)]
    heard = [{"keyword": "hey jarvis", "time_s": spans[k][0] + 0.2} for k in (0, 1, 3)]   # babble clips 2, 5 missed
    user = f"{CS.USER[0]}:{CS.USER[1]}"
    res = {"positives": {f"{v}|{snr}": B.score_positives(heard, spans, clips, words=CS.PHRASES, noisy=snr == 20)
                         for v in (user, "flite:other") for snr in (20, None)}}
    assert CS.frr(res, "user", (20,)) == pytest.approx(0.5)
    assert [CS.frr(res, "user", (20,), noise=c) for c in B.COLOURS] == [0.0, pytest.approx(0.5), 1.0]
    rows = CS.condition_rows("x", {**res, "fa": {}})
    noisy_row = [r for r in rows if r["name"].endswith("enrolment voice, 5-20 dB")]
    assert noisy_row and noisy_row[0]["by_noise"] == {"white": 0.0, "pink": 0.5, "babble": 1.0}


def test_audio_too_short_for_a_target_never_makes_a_sensitivity_looser_than_the_default(tmp_path):
    """40 s of a quiet room: no event at any threshold, which cannot show 0.1 false accepts an hour
    (one event would be 90 an hour). That point keeps the bundle's own thresholds (a QA run got the
    grid's floor, 0.2, for every keyword, so the strictest sensitivity fired the most); a target the
    audio can show (1,000 an hour: one event in 40 s is 90, a keyword's share 100) is calibrated
    as measured."""
    from edge.audio import write_wav
    from edge.detect import Detector
    from edge.device import Device
    from host.data import noise

    rng = np.random.default_rng(4)
    wav = write_wav(tmp_path / "room.wav",
                    np.clip(noise.coloured_noise(rng, "pink", (40 * 16000,)) * 30, -32768, 32767).astype(np.int16))
    dev = Device(tmp_path / "st")
    table = dev.calibrate([wav], targets=[0.1, 1000])
    km, head = dev.models()
    det = Detector(km, head=head)
    default = dict(zip(det.names, det.thresholds.tolist()))
    strict, loose = table["points"]
    assert all(strict["thresholds"][n] >= default[n] - 1e-4 for n in det.names), strict
    assert strict["held_at_default"] and "held_at_default" not in loose
    assert min(loose["thresholds"].values()) < min(default.values())  # measured: the room is quiet
