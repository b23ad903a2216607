"""PocketSphinx keyphrase spotting over one long WAV: the zero-shot, text-defined KWS peer.

Runs INSIDE the peer virtualenv (.venv-peers, made by bench/peers/setup.sh): stdlib, numpy and
pocketsphinx only, never edgelearn. bench/_peers.py drives it by subprocess:

    python pocketsphinx_kws.py JOB.json OUT.json

JOB:  {"wav": "/path/16k_mono_int16.wav",
       "keyphrases": {"yes": 1e-20, "stop": 1e-20},   # phrase -> kws threshold (a kws file line: `yes /1e-20/`)
       "thresholds": [1e-40, 1e-30, 1e-20, 1e-10, 1e-5, 1],   # optional: sweep mode
       "chunk_s": 0.1,                                  # optional: streaming block
       "config": {"kws_delay": 10}}                     # optional: extra Decoder parameters
OUT:  {"events": [{"keyword": "yes", "time_s": 2.36, "prob": 0.87}, ...],
       "hits": number of hits (utterance restarts), "cpu_s": ..., "audio_s": ..., "version": "5.1.1",
       "frame_rate": 100, ...}
      in sweep mode: {"sweep": [{"threshold": t, "events": [...], "hits": n, "cpu_s": ...}, ...],
                      "cpu_s": total, ...}
      (sweep mode uses every keyphrase at each threshold; the per-phrase values are ignored).

The decode is the deployed wake-word loop: audio streamed in chunk_s blocks through
process_raw(block, False, False); whenever hyp() is not None, the hit is reported and the utterance
restarted (end_utt(); start_utt()). Hits are the kws segments seg() returns at that moment; a hit's
time is the end of its last frame, utterance start + (end_frame + 1) / frame_rate. Within one hit a
keyphrase is reported once (its latest end). Across hits nothing is merged: PocketSphinx 5.1.1's
kws_search_start() clears the phone loop but not the keyphrase HMMs, so at permissive thresholds a
restart can re-fire the phrase just reported (a segment whose start frame is past its end frame);
that is what the deployed loop does too, so it is left in; score with a refractory window if wanted.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from importlib.metadata import version as _dist_version

from pocketsphinx import Decoder

import _peerwav  # noqa: E402 (bench/peers/, this script's folder)

RATE = _peerwav.RATE


def read_wav(path: str) -> bytes:
    return _peerwav.read_wav(path, "pocketsphinx_kws")


def _kws_file(phrases: dict[str, float], tmpdir: str) -> str:
    path = os.path.join(tmpdir, "keyphrases.kws")
    with open(path, "w") as f:
        for phrase, thr in phrases.items():
            f.write(f"{phrase} /{float(thr)!r}/\n")
    return path


def _normalise(keyphrases) -> dict[str, str]:
    """Decoder phrase (lower case, single spaces, as CMUdict spells words) -> the JOB's keyword."""
    names = list(keyphrases)
    out: dict[str, str] = {}
    for name in names:
        phrase = " ".join(str(name).lower().split())
        if not phrase:
            raise SystemExit("pocketsphinx_kws: empty keyphrase in JOB")
        if phrase in out:
            raise SystemExit(f"pocketsphinx_kws: keyphrases {out[phrase]!r} and {name!r} are the same phrase")
        out[phrase] = str(name)
    return out


def _hit_events(decoder: Decoder, utt_start: int, frate: int, names: dict[str, str]) -> list[dict]:
    """The confirmed kws segments of one hit, one event per keyphrase (its latest end frame)."""
    latest: dict[str, tuple[int, float]] = {}
    for seg in decoder.seg():
        phrase = seg.word.strip()  # the kws file's text up to the threshold, trailing space included
        if phrase not in latest or seg.end_frame > latest[phrase][0]:
            latest[phrase] = (seg.end_frame, seg.prob)
    return [{"keyword": names.get(phrase, phrase),
             "time_s": round(utt_start / RATE + (ef + 1) / frate, 4),
             "prob": round(float(prob), 6)}
            for phrase, (ef, prob) in sorted(latest.items(), key=lambda kv: kv[1][0])]


def decode(audio: bytes, phrases: dict[str, float], names: dict[str, str], chunk_s: float,
           extra: dict) -> dict:
    """One streaming decode; every phrase at its own threshold."""
    with tempfile.TemporaryDirectory() as tmp:
        decoder = Decoder(kws=_kws_file(phrases, tmp), loglevel="ERROR", **extra)
    oov = sorted({w for p in phrases for w in p.split() if decoder.lookup_word(w) is None})
    if oov:
        # PocketSphinx itself only logs these and silently never spots the phrase.
        raise SystemExit(f"pocketsphinx_kws: not in the PocketSphinx dictionary: {', '.join(oov)}")
    frate = int(decoder.config["frate"])
    step = max(1, int(round(chunk_s * RATE))) * 2  # bytes
    view = memoryview(audio)
    events: list[dict] = []
    hits = 0
    utt_start = 0  # samples fed before the current utterance began
    t0 = time.process_time()
    decoder.start_utt()
    for off in range(0, len(view), step):
        decoder.process_raw(view[off:off + step], False, False)
        if decoder.hyp() is None:
            continue
        hits += 1
        events += _hit_events(decoder, utt_start, frate, names)
        decoder.end_utt()
        utt_start = min(off + step, len(view)) // 2
        decoder.start_utt()
    decoder.end_utt()
    # A hit confirmed only by end_utt's flush (within kws_delay of the end) is still a hit.
    hyp = decoder.hyp()
    if hyp is not None:
        hits += 1
        events += _hit_events(decoder, utt_start, frate, names)
    cpu = time.process_time() - t0
    return {"events": events, "hits": hits, "cpu_s": cpu, "frame_rate": frate}


def run(job: dict) -> dict:
    wav = job["wav"]
    keyphrases = job["keyphrases"]
    if not keyphrases:
        raise SystemExit("pocketsphinx_kws: JOB has no keyphrases")
    by_phrase = _normalise(keyphrases)
    chunk_s = float(job.get("chunk_s", 0.1))
    extra = dict(job.get("config") or {})
    audio = read_wav(wav)
    out = {"audio_s": len(audio) / 2 / RATE, "version": _dist_version("pocketsphinx"),
           "chunk_s": chunk_s, "wav": wav}
    thresholds = job.get("thresholds")
    if thresholds:
        sweep, total = [], 0.0
        for t in thresholds:
            r = decode(audio, {p: float(t) for p in by_phrase}, by_phrase, chunk_s, extra)
            total += r["cpu_s"]
            out["frame_rate"] = r["frame_rate"]
            sweep.append({"threshold": float(t), "events": r["events"], "hits": r["hits"], "cpu_s": r["cpu_s"]})
        out.update(sweep=sweep, cpu_s=total)
    else:
        if not isinstance(keyphrases, dict):
            raise SystemExit("pocketsphinx_kws: keyphrases must map each phrase to its threshold "
                             "(or give \"thresholds\" for a sweep)")
        phrases = {p: float(keyphrases[n]) for p, n in by_phrase.items()}
        r = decode(audio, phrases, by_phrase, chunk_s, extra)
        out.update(events=r["events"], hits=r["hits"], cpu_s=r["cpu_s"], frame_rate=r["frame_rate"],
                   thresholds={n: phrases[p] for p, n in by_phrase.items()})
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python pocketsphinx_kws.py JOB.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        job = json.load(f)
    out = run(job)
    tmp = argv[2] + ".part"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
