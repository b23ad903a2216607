"""Speech synthesis with the engines Debian ships: espeak-ng, Festival, Flite, RHVoice and SVOX Pico.

A :class:`Voice` names one synthetic speaker. ``render(voice, texts)`` returns
16 kHz int16 utterances, trimmed of leading/trailing silence, each from a
speaking rate and pitch drawn per render. Festival runs one process per voice
for a whole batch (its start-up dominates otherwise); espeak-ng and Flite run
one short process per utterance on a small thread pool.

    >>> v = Voice("espeak", "en-us+f3")
    >>> [pcm] = render(v, ["yes"], rng=np.random.default_rng(0))
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
import threading
import wave
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError

SR = 16000
MAX_SAMPLES = SR  # every utterance must fit the 1 s window

ESPEAK_ACCENTS = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp",
                  "en-gb-x-gbcwmd", "en-029", "en-us-nyc"]
# Eight variants per accent, rotated so that no two accents share the same set.
ESPEAK_VARIANTS = ["m1", "f1", "m3", "f2", "m5", "f3", "m2", "f4", "m4", "f5", "m6",
                   "klatt", "m7", "klatt2", "iven", "klatt3", "steph", "linda", "john",
                   "Andy", "Annie", "adam", "belinda", "david", "max", "robert"]
VARIANTS_PER_ACCENT = 8
FESTIVAL_VOICES = ["kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts"]
# Flite's awb and rms are speakers neither other engine has (its kal and slt are
# the same people as Festival's): they are the never-trained-on synthesizer.
FLITE_VOICES = ["awb", "rms"]
# RHVoice (Debian non-free, `rhvoice rhvoice-english`): HTS voices built from CMU ARCTIC recordings of
# real speakers. Only bdl (US male) and clb (US female) are usable: their data is LGPL-2.1+ (the
# package's evgeniy-eng and lyubov are CC-BY-NC-ND), and alan and slt are the same people as Flite's
# awb and Festival's slt, which are held out. Not in the shipped corpus (CorpusConfig.synths);
# scripts/train_variant.py --rhvoice adds them.
RHVOICE_VOICES = ["bdl", "clb"]
# SVOX Pico (Debian non-free, `libttspico-utils`; Apache-2.0, in non-free because its language files
# come without their sources): the Android synthesizer's two English voices, a US and a British woman.
# Not in the shipped corpus either; scripts/train_variant.py --pico adds them.
PICO_VOICES = ["en-US", "en-GB"]
# Festival's two British English diphone voices of other speakers (Debian main, under Festival's own
# free licence like kal's): CSTR's rab (`festvox-rablpc16k`) and don (`festvox-don`, a minimal
# diphone set). Not in the shipped corpus (measured and not adopted: docs/frontend-and-model.md,
# "Festival's other two English voices"); scripts/train_variant.py --festival-extra adds them.
FESTIVAL_EXTRA_VOICES = ["rab_diphone", "don_diphone"]
FESTIVAL_EXTRA_PACKAGES = {"rab_diphone": "festvox-rablpc16k", "don_diphone": "festvox-don"}
FESTIVAL_VOICE_DIRS = ("/usr/share/festival/voices", "/usr/lib/festival/voices")
NON_FREE = ("rhvoice", "pico")

PACKAGES = {"espeak": "espeak-ng", "festival": "festival festvox-kallpc16k festvox-kdlpc16k "
            "festvox-us-slt-hts", "flite": "flite",
            "rhvoice": "rhvoice rhvoice-english", "pico": "libttspico-utils"}
BINARIES = {"espeak": "espeak-ng", "festival": "festival", "flite": "flite", "rhvoice": "RHVoice-test",
            "pico": "pico2wave"}


@dataclass(frozen=True)
class Voice:
    synth: str  # espeak | festival | flite | rhvoice | pico
    name: str

    @property
    def id(self) -> str:
        return f"{self.synth}:{self.name}"


def espeak_voices() -> list[Voice]:
    out = []
    for i, accent in enumerate(ESPEAK_ACCENTS):
        for j in range(VARIANTS_PER_ACCENT):
            variant = ESPEAK_VARIANTS[(i * 3 + j) % len(ESPEAK_VARIANTS)]
            out.append(Voice("espeak", f"{accent}+{variant}"))
    return out


def all_voices() -> list[Voice]:
    return (espeak_voices() + [Voice("festival", v) for v in FESTIVAL_VOICES]
            + [Voice("flite", v) for v in FLITE_VOICES])


def check_installed(synths) -> None:
    missing = [s for s in sorted(set(synths)) if shutil.which(BINARIES[s]) is None]
    if missing:
        pkgs = " ".join(PACKAGES[s] for s in missing)
        where = (" from Debian's non-free component (add `non-free` to your apt sources' Components)"
                 if set(missing) & set(NON_FREE) else " (or run scripts/bootstrap.sh)")
        raise EdgelearnError(f"speech synthesizer(s) not installed: {', '.join(missing)}",
                             fix=f"`sudo apt-get install {pkgs}`{where}")


def check_festival_voices(names) -> None:
    """One EdgelearnError naming the packages of Festival voices in ``names`` that are not installed
    (a Festival voice is a directory of that name under one of ``FESTIVAL_VOICE_DIRS``' languages)."""
    check_installed(["festival"])
    have = {d.name for root in FESTIVAL_VOICE_DIRS if Path(root).is_dir()
            for lang in Path(root).iterdir() if lang.is_dir() for d in lang.iterdir()}
    missing = [n for n in names if n not in have]
    if missing:
        pkgs = " ".join(FESTIVAL_EXTRA_PACKAGES.get(n, f"<the package of {n}>") for n in missing)
        raise EdgelearnError(f"Festival voice(s) not installed: {', '.join(missing)}",
                             fix=f"`sudo apt-get install {pkgs}`")


def parse_wav_bytes(data: bytes) -> tuple[np.ndarray, int]:
    """Parse a PCM16 WAV from bytes, tolerating a streaming header (espeak-ng --stdout)."""
    if data[:4] != b"RIFF":
        raise ValueError("synthesizer did not return a WAV")
    pos, rate, channels = 12, None, 1
    while pos + 8 <= len(data):
        cid, size = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "little")
        if cid == b"fmt ":
            channels = int.from_bytes(data[pos + 10:pos + 12], "little")
            rate = int.from_bytes(data[pos + 12:pos + 16], "little")
        if cid == b"data":
            body = data[pos + 8:]
            body = body[: min(size, len(body)) // 2 * 2]
            pcm = np.frombuffer(body, dtype="<i2").astype(np.int16)
            if channels > 1:
                pcm = pcm.reshape(-1, channels)[:, 0].copy()
            return pcm, int(rate or SR)
        pos += 8 + size + (size & 1)
    raise ValueError("WAV without a data chunk")


def resample(pcm: np.ndarray, rate: int, target: int = SR) -> np.ndarray:
    if rate == target:
        return pcm.astype(np.float32)
    from math import gcd

    from scipy.signal import resample_poly

    g = gcd(rate, target)
    return resample_poly(pcm.astype(np.float32), target // g, rate // g).astype(np.float32)


def trim(x: np.ndarray, rel_db: float = -40.0, pad: int = 480) -> np.ndarray:
    """Cut leading/trailing silence: keep from the first to the last 10 ms block above rel_db."""
    if x.size == 0:
        return x
    block = 160
    n = x.size // block
    if n == 0:
        return x
    e = (x[: n * block].reshape(n, block).astype(np.float64) ** 2).mean(axis=1)
    thresh = e.max() * 10 ** (rel_db / 10)
    idx = np.nonzero(e > thresh)[0]
    if idx.size == 0:
        return x[:0]
    a, b = max(0, idx[0] * block - pad), min(x.size, (idx[-1] + 1) * block + pad)
    return x[a:b]


def fit_length(x: np.ndarray, max_samples: int = MAX_SAMPLES - 800) -> np.ndarray:
    """Utterances longer than ~0.95 s are sped up to fit the 1 s window."""
    if x.size <= max_samples:
        return x
    from scipy.signal import resample

    return resample(x, max_samples).astype(np.float32)


def finish(pcm: np.ndarray, rate: int) -> np.ndarray:
    x = fit_length(trim(resample(pcm, rate)))
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak < 1.0:
        raise ValueError("synthesizer produced silence")
    x = x * (0.5 * 32767.0 / peak)  # fixed peak level; gain varies later in augmentation
    return np.round(x).astype(np.int16)


class RenderCancelled(Exception):
    """Rendering stopped because the pool it ran in was interrupted (:func:`pool_map`)."""


# A pool's worker threads carry its stop event and its running synthesizer processes; a render
# outside any pool (the main thread, a test) carries none and is never cancelled.
_POOL = threading.local()


def stopping() -> bool:
    """True in a pool's worker once the pool was interrupted (no more progress to show)."""
    stop = getattr(_POOL, "stop", None)
    return stop is not None and stop.is_set()


def pool_map(fn, items, workers: int = 2):
    """Yield ``(item, fn(item))`` as they complete, ``workers`` at a time on threads. On any exception
    (a failed render, or Ctrl-C in the caller) queued items are cancelled, the workers' later renders
    raise RenderCancelled and their running synthesizers are killed, so the caller returns at once
    instead of waiting for every queued render (``with ThreadPoolExecutor`` waited for all of them)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    stop, live, lock = threading.Event(), set(), threading.Lock()

    def one(item):
        _POOL.stop, _POOL.live, _POOL.lock = stop, live, lock
        try:
            return fn(item)
        finally:
            _POOL.stop = _POOL.live = _POOL.lock = None

    ex = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futs = {ex.submit(one, it): it for it in items}
        for f in as_completed(futs):
            yield futs[f], f.result()
    except BaseException:
        stop.set()
        with lock:
            procs = list(live)
        for proc in procs:
            try:
                proc.kill()
            except OSError:
                pass
        ex.shutdown(wait=False, cancel_futures=True)
        raise
    ex.shutdown()


@contextmanager
def pooled(fn, items, workers: int = 2):
    """``pool_map`` closed however its consumer leaves: Ctrl-C in the consumer's own code (between two
    results) leaves the generator waiting at its ``yield``, and only closing it there cancels the
    queued renders. Left to the garbage collector, that waits for the last reference to the
    consumer's frame; a traceback kept anywhere keeps it, and the queue goes on rendering."""
    it = pool_map(fn, items, workers)
    try:
        yield it
    finally:
        it.close()


def _run(cmd: list[str], timeout: float = 60.0, input: bytes | None = None) -> bytes:
    stop, live, lock = (getattr(_POOL, k, None) for k in ("stop", "live", "lock"))
    if stop is not None and stop.is_set():
        raise RenderCancelled(cmd[0])
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if live is not None:
        with lock:
            live.add(proc)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    finally:
        if live is not None:
            with lock:
                live.discard(proc)
    if stop is not None and stop.is_set():
        raise RenderCancelled(cmd[0])
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {err.decode(errors='replace')[:200]}")
    return out


def _espeak(voice: Voice, text: str, rate: float, pitch: float) -> np.ndarray:
    out = _run(["espeak-ng", "-v", voice.name, "-s", str(int(175 * rate)),
                "-p", str(int(50 * pitch)), "--stdout", text])
    return finish(*parse_wav_bytes(out))


def _flite(voice: Voice, text: str, rate: float, pitch: float) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "out.wav"
        _run(["flite", "-voice", voice.name, "-t", text, "-o", str(path),
              "--setf", f"duration_stretch={1.0 / rate:.3f}",
              "--setf", f"int_f0_target_mean={int(110 * pitch)}"])
        return finish(*parse_wav_bytes(path.read_bytes()))


def _rhvoice(voice: Voice, text: str, rate: float, pitch: float) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "out.wav"
        _run(["RHVoice-test", "-p", voice.name, "-r", str(int(round(100 * rate))), "-o", str(path)],
             input=text.encode())
        if not path.exists():
            raise RuntimeError("RHVoice-test failed: it wrote no WAV")
        pcm, sr = parse_wav_bytes(path.read_bytes())
        # pitch as Festival's HTS voice gets it: relabel the sample rate (a different vocal tract)
        return finish(pcm, int(sr * pitch))


def _pico(voice: Voice, text: str, rate: float, pitch: float) -> np.ndarray:
    from xml.sax.saxutils import escape

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "out.wav"  # pico2wave wants a name ending in .wav
        _run(["pico2wave", "-l", voice.name, "-w", str(path),
              f'<speed level="{int(round(100 * rate))}">{escape(text)}</speed>'])
        pcm, sr = parse_wav_bytes(path.read_bytes())
        # pitch as RHVoice's and Festival's HTS voices get it: relabel the sample rate
        return finish(pcm, int(sr * pitch))


def _festival_batch(voice: Voice, jobs: list[tuple[str, float, float]]) -> list[np.ndarray]:
    """One Festival process renders every (text, rate, pitch) job for this voice."""
    with tempfile.TemporaryDirectory() as d:
        lines = [f"(voice_{voice.name})"]
        for i, (text, rate, _pitch) in enumerate(jobs):
            safe = text.replace('"', "")
            lines.append(f"(Parameter.set 'Duration_Stretch {1.0 / rate:.3f})")
            lines.append(f'(utt.save.wave (utt.synth (Utterance Text "{safe}")) "{d}/{i}.wav" \'riff)')
        script = Path(d) / "batch.scm"
        script.write_text("\n".join(lines) + "\n")
        _run(["festival", "-b", str(script)], timeout=60 + 5 * len(jobs))
        out = []
        for i, (_text, _rate, pitch) in enumerate(jobs):
            pcm, sr = parse_wav_bytes((Path(d) / f"{i}.wav").read_bytes())
            # Festival's diphone/HTS voices have no portable pitch knob: shift by
            # relabelling the sample rate (pitch and formants move together, like
            # a different vocal tract), which is what the pitch draw asks for.
            out.append(finish(pcm, int(sr * pitch)))
        return out


def render(voice: Voice, jobs: list[tuple[str, float, float]]) -> list[np.ndarray]:
    """Render ``(text, rate, pitch)`` jobs (rate, pitch are multipliers around 1.0)."""
    if voice.synth == "festival":
        return _festival_batch(voice, jobs)
    fn = {"espeak": _espeak, "flite": _flite, "rhvoice": _rhvoice, "pico": _pico}[voice.synth]
    return [fn(voice, t, r, p) for t, r, p in jobs]


def render_jobs(jobs, label: str) -> dict:
    """jobs: [(voice, text, rate, pitch, key)] -> {key: int16}; two workers (subprocess synths)."""
    from host.data.corpus import Progress

    by_voice: dict = {}
    for v, text, r, p, key in jobs:
        by_voice.setdefault(v.id, (v, []))[1].append((text, r, p, key))
    prog = Progress(len(jobs), label)
    out = {}

    def work(item):
        v, js = item
        res = {}
        for a in range(0, len(js), 40):  # festival renders a batch per process
            part = js[a:a + 40]
            for (t, r, p, key), pcm in zip(part, render(v, [(t, r, p) for t, r, p, _ in part])):
                res[key] = pcm
            prog.step(len(part))
        return res

    with pooled(work, list(by_voice.values()), workers=2) as results:
        done = {item[0].id: res for item, res in results}
    for vid in by_voice:  # in the voices' order, as before
        out.update(done[vid])
    return out


def read_wav_file(path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").copy(), w.getframerate()


def pcm_to_wav_bytes(pcm: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(pcm.astype("<i2").tobytes())
    return buf.getvalue()
