"""bench/_peers.py: the JOB/OUT contract with a peer runner, and the real PocketSphinx runner end to end.

The contract tests use a fake peer python (a script in tmp_path that records its JOB and answers a
canned OUT), so they run everywhere; the end-to-end test needs .venv-peers (bash bench/peers/setup.sh),
espeak-ng and sox, and skips with the reason otherwise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from bench import _peers

CANNED = {"events": [{"keyword": "yes", "time_s": 1.23, "prob": 0.9}], "cpu_s": 0.5, "audio_s": 3.0,
          "version": "5.1.1", "frame_rate": 100}


def _wav(path: Path, seconds: float = 0.5) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * int(16000 * seconds))
    return path


def _fake_python(tmp_path: Path, out: dict | None = None, rc: int = 0, stderr: str = "", raw: str | None = None) -> Path:
    """A stand-in for the peer venv's python: records argv, JOB and PYTHONPATH, writes OUT (or not)."""
    script = tmp_path / "fake-python"
    record = tmp_path / "record.json"
    body = raw if raw is not None else json.dumps(out if out is not None else CANNED)
    script.write_text(f"""#!{sys.executable}
import json, os, sys
runner, job_path, out_path = sys.argv[1:4]
job = json.load(open(job_path))
json.dump({{"argv": sys.argv[1:], "job": job, "pythonpath": os.environ.get("PYTHONPATH")}}, open({str(record)!r}, "w"))
if {rc!r}:
    sys.stderr.write({stderr!r})
    sys.exit({rc!r})
body = {body!r}
if job.get("thresholds") and {out is None and raw is None!r}:
    body = json.dumps({{"sweep": [{{"threshold": t, "events": [], "cpu_s": 0.1}} for t in job["thresholds"]],
                       "cpu_s": 0.1 * len(job["thresholds"]), "audio_s": 3.0, "version": "5.1.1"}})
open(out_path, "w").write(body)
""")
    script.chmod(0o755)
    return script


def _record(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "record.json").read_text())


def test_job_and_out_contract(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/edgelearn")
    wav = _wav(tmp_path / "a.wav")
    out = _peers.run_pocketsphinx(wav, {"yes": 1e-20, "stop": 1e-10}, python=_fake_python(tmp_path))
    assert out == CANNED
    rec = _record(tmp_path)
    assert Path(rec["argv"][0]) == _peers.POCKETSPHINX_RUNNER and _peers.POCKETSPHINX_RUNNER.is_file()
    assert rec["job"] == {"wav": str(wav.resolve()), "keyphrases": {"yes": 1e-20, "stop": 1e-10}}
    assert rec["pythonpath"] is None  # the peer never sees edgelearn's import path


def test_sweep_job_carries_thresholds(tmp_path):
    wav = _wav(tmp_path / "a.wav")
    out = _peers.run_pocketsphinx(wav, ["yes", "no"], thresholds=[1e-40, 1e-20, 1], chunk_s=0.05,
                                  config={"kws_delay": 5}, python=_fake_python(tmp_path))
    job = _record(tmp_path)["job"]
    assert job["thresholds"] == [1e-40, 1e-20, 1.0] and job["keyphrases"] == ["yes", "no"]
    assert job["chunk_s"] == 0.05 and job["config"] == {"kws_delay": 5}
    assert [s["threshold"] for s in out["sweep"]] == [1e-40, 1e-20, 1.0]


def test_env_override_names_the_peer_python(tmp_path, monkeypatch):
    fake = _fake_python(tmp_path)
    monkeypatch.setenv("EDGELEARN_PEERS_PYTHON", str(fake))
    assert _peers.peer_python() == fake and _peers.why_no_peer() == ""
    assert _peers.run_pocketsphinx(_wav(tmp_path / "a.wav"), {"yes": 1e-20}) == CANNED


def test_missing_venv_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGELEARN_PEERS_PYTHON", raising=False)
    monkeypatch.setattr(_peers, "ROOT", tmp_path)
    assert _peers.peer_python() is None
    assert "bash bench/peers/setup.sh" in _peers.why_no_peer()
    with pytest.raises(RuntimeError, match=r"bash bench/peers/setup\.sh"):
        _peers.run_pocketsphinx(_wav(tmp_path / "a.wav"), {"yes": 1e-20})
    # A venv without pocketsphinx in it is not set up either.
    py = tmp_path / ".venv-peers" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("")
    assert _peers.peer_python() is None and "no pocketsphinx" in _peers.why_no_peer()


def test_peer_failure_and_bad_out_are_errors(tmp_path):
    wav = _wav(tmp_path / "a.wav")
    with pytest.raises(RuntimeError, match="exit 3.*not in the PocketSphinx dictionary: zzqx"):
        _peers.run_pocketsphinx(wav, {"zzqx": 1e-20}, python=_fake_python(
            tmp_path, rc=3, stderr="pocketsphinx_kws: not in the PocketSphinx dictionary: zzqx\n"))
    with pytest.raises(RuntimeError, match="lacks events"):
        _peers.run_pocketsphinx(wav, {"yes": 1e-20}, python=_fake_python(tmp_path, out={"cpu_s": 1}))
    with pytest.raises(RuntimeError, match="malformed event"):
        bad = dict(CANNED, events=[{"keyword": "yes"}])
        _peers.run_pocketsphinx(wav, {"yes": 1e-20}, python=_fake_python(tmp_path, out=bad))
    with pytest.raises(RuntimeError, match="unreadable OUT"):
        _peers.run_pocketsphinx(wav, {"yes": 1e-20}, python=_fake_python(tmp_path, raw="{not json"))
    with pytest.raises(ValueError, match="threshold"):
        _peers.run_pocketsphinx(wav, ["yes"], python=_fake_python(tmp_path))  # a list needs thresholds=
    with pytest.raises(FileNotFoundError):
        _peers.run_pocketsphinx(tmp_path / "none.wav", {"yes": 1e-20}, python=_fake_python(tmp_path))


# --- the real runner -------------------------------------------------------------------------------

def _say(text: str, out: Path, tmp: Path) -> float:
    raw = tmp / f"{text}-22k.wav"
    subprocess.run(["espeak-ng", "-w", str(raw), text], check=True, capture_output=True)
    subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True, capture_output=True)
    with wave.open(str(out), "rb") as w:
        return w.getnframes() / 16000


def test_pocketsphinx_runner_end_to_end(tmp_path):
    if _peers.peer_python() is None:
        pytest.skip(f"PocketSphinx peer: {_peers.why_no_peer()}")
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install {tool})")
    yes_s = _say("yes", tmp_path / "yes.wav", tmp_path)
    stop_s = _say("stop", tmp_path / "stop.wav", tmp_path)
    gap = tmp_path / "gap.wav"
    subprocess.run(["sox", "-n", "-r", "16000", "-c", "1", "-b", "16", str(gap), "trim", "0", "2"], check=True)
    speech = tmp_path / "speech.wav"  # 2 s, "yes", 4 s, "stop", 2 s
    subprocess.run(["sox", str(gap), str(tmp_path / "yes.wav"), str(gap), str(gap), str(tmp_path / "stop.wav"),
                    str(gap), str(speech)], check=True)
    with wave.open(str(speech), "rb") as w:
        total = w.getnframes() / 16000
    # A faint, repeatable noise floor: exact digital silence is no microphone's (and makes PocketSphinx's
    # live CMN spot short words in it).
    noise = tmp_path / "noise.wav"
    subprocess.run(["sox", "-R", "-n", "-r", "16000", "-c", "1", "-b", "16", str(noise), "synth", f"{total}",
                    "whitenoise", "vol", "0.003"], check=True)
    wav = tmp_path / "test.wav"
    subprocess.run(["sox", "-m", str(speech), str(noise), str(wav)], check=True)
    yes_at = (2.0, 2.0 + yes_s)
    stop_at = (2.0 + yes_s + 4.0, 2.0 + yes_s + 4.0 + stop_s)

    out = _peers.run_pocketsphinx(wav, {"yes": 1e-20, "stop": 1e-20})
    assert out["version"] == "5.1.1" and out["frame_rate"] == 100
    assert out["audio_s"] == pytest.approx(total, abs=1e-3)
    assert out["cpu_s"] > 0
    for ev in out["events"]:
        assert set(ev) >= {"keyword", "time_s"} and ev["keyword"] in ("yes", "stop")
        assert 0 < ev["time_s"] <= total + 0.05
    for word, (start, end) in (("stop", stop_at), ("yes", yes_at)):
        times = [e["time_s"] for e in out["events"] if e["keyword"] == word]
        assert any(start < t < end + 0.3 for t in times), (word, (start, end), out["events"])
    # Nothing is heard before the first word is spoken.
    assert all(e["time_s"] > yes_at[0] for e in out["events"]), out["events"]

    sweep = _peers.run_pocketsphinx(wav, ["stop"], thresholds=[1e-20, 1e30])
    assert [s["threshold"] for s in sweep["sweep"]] == [1e-20, 1e30]
    assert sweep["cpu_s"] == pytest.approx(sum(s["cpu_s"] for s in sweep["sweep"]))
    lenient, strict = sweep["sweep"]
    assert any(stop_at[0] < e["time_s"] < stop_at[1] + 0.3 for e in lenient["events"]), lenient
    assert strict["events"] == []  # a 1e30 likelihood ratio is beyond anything a real phrase scores


def test_wakeword_peers_end_to_end(tmp_path):
    """openWakeWord's and microWakeWord's released models in the peer venv: one trace per system and
    WAV, times within the audio, the manifest's cutoff as microWakeWord's default; a stream of a
    renders of "hey jarvis" scores higher on it than the same length of silence."""
    py = _peers.peer_python()
    if py is None or not any((py.parent.parent / "lib").glob("python*/site-packages/pymicro_wakeword")):
        pytest.skip("wake-word peers: run `bash bench/peers/setup.sh`")
    if shutil.which("flite") is None:
        pytest.skip("flite not installed")
    import numpy as np

    from host.data import synth

    pcm = synth.render(synth.Voice("flite", "awb"), [("hey jarvis", 1.0, 1.0)])[0]
    speech = np.concatenate([np.zeros(16000, np.int16), pcm, np.zeros(16000, np.int16)])
    (tmp_path / "jarvis.wav").write_bytes(synth.pcm_to_wav_bytes(speech))
    (tmp_path / "quiet.wav").write_bytes(synth.pcm_to_wav_bytes(np.zeros(len(speech), np.int16)))
    wavs = [tmp_path / "jarvis.wav", tmp_path / "quiet.wav"]
    systems = ["openwakeword:hey_jarvis", "microwakeword:hey_jarvis"]
    out = _peers.run_wakeword_peers(wavs, systems)
    assert out["audio_s"] == pytest.approx(2 * len(speech) / 16000)
    assert out["defaults"]["microwakeword:hey_jarvis"]["threshold"] == pytest.approx(0.97)
    assert set(out["cpu_s"]) == {"openwakeword", "microwakeword"}
    for s in systems:
        jar, quiet = (out["runs"][s][str(w.resolve())] for w in wavs)
        assert jar["t"] and all(0 < t <= len(speech) / 16000 + 1e-3 for t in jar["t"])
        assert max(jar["p"]) > max(quiet["p"])
    with pytest.raises(ValueError):
        _peers.run_wakeword_peers([tmp_path / "missing.wav"], systems)


def test_kws_custom_events_and_fair_thresholds():
    """The custom wake-word bench's rules: a peer's trace becomes one event per refractory period
    where it exceeds the threshold; each phrase gets the lowest grid value at which its own false
    accepts on the synthetic negatives are <= 0.5 per hour, or None when one phrase has none."""
    from bench import kws_custom as K

    trace = {"t": [0.1, 0.2, 0.3, 1.5, 2.0, 3.0], "p": [0.2, 0.9, 0.95, 0.99, 0.1, 0.6]}
    assert [e["time_s"] for e in K.events_at(trace, 0.5, "alexa")] == [0.2, 1.5, 3.0]  # 0.3: within 1 s
    assert [e["time_s"] for e in K.events_at(trace, 0.97, "alexa")] == [1.5]

    quiet_from = {"alexa": 0.99}  # the value from which a phrase fires at most 0.5 times an hour

    def negatives(values):  # 2 h of negatives: 3 false accepts below that value, 1 (0.5 FA/h) from it
        kws = {ph: 1 if v >= quiet_from.get(ph, 0.95) else 3 for ph, v in values.items()}
        return {"fa": {"synthetic": {"hours": 2.0, "keywords": kws}}}

    chosen = K.fair_thresholds(negatives, [0.5, 0.9, 0.95, 0.99])
    assert chosen == {"hey jarvis": 0.95, "alexa": 0.99, "hey mycroft": 0.95, "okay nabu": 0.95}
    assert K.fair_thresholds(negatives, [0.5, 0.9]) is None


def test_kws_custom_scores_real_speech_under_noise_as_its_own_negatives():
    """False accepts on the noisy copies of the real test half are counted apart from the clean ones
    (per hour per wake word) and get their own row."""
    import numpy as np

    from bench import kws_custom as K

    def events_of(name, pcm):
        return [{"keyword": "alexa", "time_s": 1.0}] * (2 if name.startswith("real_test_") else 1)

    hour = np.zeros(16000 * 3600, np.int16)
    r = K.score(events_of, {}, {}, {"real_test": hour}, {"real_test_20db": hour, "real_test_10db": hour})
    assert r["fa"]["real"]["fa"] == 1 and r["fa"]["noisy"]["fa"] == 4
    assert r["fa"]["noisy"]["fa_per_hour"] == 4 / 2 / len(K.PHRASES)
    assert "noisy" not in K.score(events_of, {}, {}, {"real_test": hour})["fa"]
    heard = {f"{v}|{snr}": {"recall": 1.0, "n": 1} for v in ("flite:awb", "flite:rms") for snr in (None, 20, 10, 5)}
    rows = [x for x in K.condition_rows("x", {**r, "positives": heard}) if "negative speech" in x["name"]]
    assert [x["name"] for x in rows] == ["x: real negative speech (60 min)",
                                         "x: real negative speech under 20 and 10 dB noise (120 min)"]
