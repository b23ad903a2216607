"""What a board holds, prepared on the host: compiled firmware, the bundle, config and device key.

Used by ``edgelearn flash`` (which copies the list over the raw REPL) and by
tests that give the unix port a directory as its filesystem directly.
Also the test clips: enrolment and detection WAVs of two custom phrases from
the rendered corpus (held-out voices of one synthesizer), or synthetic voiced sounds when no
corpus is rendered on this machine.

    files = board_files(Path("build/board"), Path("models/kws-mcu-tcnn"), "esp32-07", key)
    install_local(files, Path("/tmp/board"))                 # a unix-port filesystem
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from edge.kws import MODELS
from host.board.manifest import bundle_files, compile_firmware

DEFAULT_BUNDLE = MODELS / "kws-mcu-tcnn"   # the shipped MCU bundle (package data of edge)


def board_files(work: Path, bundle: Path, device_id: str, key: bytes, bundle_dest: str = "bundle.new"):
    """(local, board path) pairs: firmware .mpy, bundle files, config.json and state/device.key."""
    work = Path(work)
    files = compile_firmware(work / "mpy")
    files += bundle_files(bundle, work / "bundle", dest=bundle_dest)
    (work / "config.json").write_text(json.dumps({"device_id": device_id, "keywords": []}))
    (work / "device.key").write_bytes(key)
    return files + [(work / "config.json", "config.json"), (work / "device.key", "state/device.key")]


def install_local(files, fs_dir: Path) -> None:
    for local, remote in files:
        dst = Path(fs_dir) / remote
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, dst)


def _voiced(f0: float, formant: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(16000) / 16000
    env = np.exp(-((t - 0.5) / 0.18) ** 2)
    x = sum(np.sin(2 * np.pi * k * f0 * (1 + 0.1 * t) * t) * np.exp(-((k * f0 - formant) / 400) ** 2)
            for k in range(1, 30))
    return np.clip(x * env * 8000 + rng.normal(0, 100, 16000), -32768, 32767).astype(np.int16)


def phrase_clips(n: int = 6):
    """Two custom phrases, ``n`` clips each, one synthesizer (held-out voices): ({phrase: [int16 clips]}, source)."""
    try:
        from host.data.corpus import default_cache_dir, load_corpus
        cache = sorted(default_cache_dir().glob("corpus-*"))
        c = load_corpus(cache[0])
        from edge.features import fit_to_window
        idx = c.select(("test", "unseen"), kinds=("custom",))
        by: dict[tuple[str, str], list[int]] = {}
        for i in idx:
            # at most 4 renders per voice and phrase: group by synthesizer (several voices) instead
            by.setdefault((str(c.text[i]), str(c.voice[i]).split(":")[0]), []).append(i)
        voices: dict[str, dict[str, list[int]]] = {}
        for (phrase, voice), ids in by.items():
            voices.setdefault(voice, {})[phrase] = ids
        for voice, phrases in sorted(voices.items()):
            good = [p for p, ids in sorted(phrases.items()) if len(ids) >= n]
            if len(good) >= 2:
                return ({p: [fit_to_window(np.asarray(c.utterance(i))).astype(np.int16)
                             for i in phrases[p][:n]] for p in good[:2]}, f"corpus, {voice} voices")
    except Exception:  # no corpus here: fall through to synthetic sounds
        pass
    return ({"low-ah": [_voiced(110, 700, s) for s in range(n)],
             "high-ee": [_voiced(220, 2300, 100 + s) for s in range(n)]}, "synthetic")
