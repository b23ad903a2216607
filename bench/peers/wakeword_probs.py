"""openWakeWord's and microWakeWord's released models over long WAVs: their probability traces.

Runs INSIDE the peer virtualenv (.venv-peers, made by bench/peers/setup.sh): stdlib, numpy,
pyopen-wakeword and pymicro-wakeword only, never edgelearn. bench/_peers.py drives it by
subprocess:

    python wakeword_probs.py JOB.json OUT.json

JOB:  {"wavs": ["/path/a.wav", ...],                      # 16 kHz mono int16
       "systems": ["openwakeword:hey_jarvis", "microwakeword:okay_nabu", ...]}
OUT:  {"runs": {"<system>": {"<wav>": {"t": [s, ...], "p": [prob, ...]}}},
       "cpu_s": {"openwakeword": seconds, "microwakeword": seconds}, "audio_s": seconds of audio,
       "defaults": {"<system>": {"threshold": t, "sliding_window": n}},
       "versions": {"pyopen-wakeword": v, "pymicro-wakeword": v}}

Each system runs as its package's own streaming loop does (their ``__main__``): openWakeWord's
features (melspectrogram + Google's speech embedding) fed 80 ms chunks, then the wake word model,
one probability per 80 ms; microWakeWord's TFLite Micro front end (pymicro-features) fed 30 ms
chunks, the streaming model every ``stride`` feature frames and the mean of the last
``sliding_window_size`` outputs, one value per inference (``process_streaming_prob``). ``t`` is the
audio time when each value came out; a caller detects where a value exceeds a threshold. The
defaults are openWakeWord's 0.5 (wyoming-openwakeword's default threshold) and each
microWakeWord model's ``probability_cutoff`` from its manifest. Both models are re-created per WAV,
so no state carries from one WAV to the next. Each package's front end runs once per WAV and feeds
all of its models (as one server runs several wake words); CPU seconds per package include it.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version as _dist_version

import numpy as np

import _peerwav  # noqa: E402 (bench/peers/, this script's folder)

RATE = _peerwav.RATE


def read_wav(path: str) -> bytes:
    return _peerwav.read_wav(path, "wakeword_probs")


def run_openwakeword(names: list[str], audio: bytes) -> dict:
    """{name: (times, probs)}: one feature pipeline feeds every model, as wyoming-openwakeword
    runs several wake words on one stream."""
    from pyopen_wakeword import Model, OpenWakeWord, OpenWakeWordFeatures

    models, feats = {n: OpenWakeWord.from_builtin(Model(n)) for n in names}, OpenWakeWordFeatures.from_builtin()
    out = {n: ([], []) for n in names}
    step = 1280 * 2  # 80 ms of int16
    for a in range(0, len(audio), step):
        t = round(min(len(audio), a + step) / 2 / RATE, 3)
        for emb in feats.process_streaming(audio[a:a + step]):
            for n, m in models.items():
                for p in m.process_streaming(emb):
                    out[n][0].append(t)
                    out[n][1].append(round(float(p), 4))
    for m in models.values():
        m.close()
    feats.close()
    return out


def run_microwakeword(names: list[str], audio: bytes) -> dict:
    """{name: (times, probs)}: one TFLite Micro front end feeds every model."""
    from pymicro_wakeword import MicroWakeWord, MicroWakeWordFeatures, Model

    models, feats = {n: MicroWakeWord.from_builtin(Model(n)) for n in names}, MicroWakeWordFeatures()
    out = {n: ([], []) for n in names}
    step = 480 * 2  # 30 ms of int16
    for a in range(0, len(audio), step):
        t = round(min(len(audio), a + step) / 2 / RATE, 3)
        for f in feats.process_streaming(audio[a:a + step]):
            for n, m in models.items():
                p = m.process_streaming_prob(f)
                if p is not None and not m._features:  # an inference ran (the others return 0.0)
                    out[n][0].append(t)
                    out[n][1].append(round(float(p), 4))
    for m in models.values():
        m.close()
    return out


def defaults(system: str) -> dict:
    kind, name = system.split(":", 1)
    if kind == "openwakeword":
        return {"threshold": 0.5, "sliding_window": 1}
    from pymicro_wakeword import MicroWakeWord, Model

    mww = MicroWakeWord.from_builtin(Model(name))
    out = {"threshold": float(mww.probability_cutoff), "sliding_window": int(mww.sliding_window_size)}
    mww.close()
    return out


def main(job_path: str, out_path: str) -> None:
    job = json.loads(open(job_path).read())
    audio = {w: read_wav(w) for w in job["wavs"]}
    runs, cpu, dflt = {}, {}, {}
    kinds = {}
    for system in job["systems"]:
        kind, name = system.split(":", 1)
        if kind not in ("openwakeword", "microwakeword"):
            raise SystemExit(f"wakeword_probs: unknown system {system!r} (openwakeword:NAME or microwakeword:NAME)")
        kinds.setdefault(kind, []).append(name)
    for kind, names in kinds.items():
        fn = run_openwakeword if kind == "openwakeword" else run_microwakeword
        for n in names:
            runs[f"{kind}:{n}"] = {}
        t0 = time.process_time()
        for w, pcm in audio.items():
            for n, (t, p) in fn(names, pcm).items():
                runs[f"{kind}:{n}"][w] = {"t": t, "p": p}
        cpu[kind] = time.process_time() - t0
        for n in names:
            dflt[f"{kind}:{n}"] = defaults(f"{kind}:{n}")
    out = {"runs": runs, "cpu_s": cpu, "audio_s": sum(len(a) for a in audio.values()) / 2 / RATE,
           "defaults": dflt,
           "versions": {d: _dist_version(d) for d in ("pyopen-wakeword", "pymicro-wakeword")}}
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: wakeword_probs.py JOB.json OUT.json")
    main(sys.argv[1], sys.argv[2])
