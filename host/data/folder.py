"""Load a user's corpus in the Speech Commands layout: ``ROOT/<word>/<clip>.wav``.

Every clip is checked with :func:`edge.audio.read_wav` (16 kHz, mono, 16-bit,
not truncated, not empty) and every problem is collected, so one run lists all
bad files instead of stopping at the first. Folders starting with ``_`` other
than ``_silence_``/``_unknown_`` (e.g. ``_background_noise_``) are noise, not
classes.

    >>> ds = load_folder("my_commands", expect=["yes", "no"])
    >>> ds.x.shape, ds.labels
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge.audio import read_wav
from edge.errors import AudioError, EdgelearnError
from edge.features import fit_to_window


@dataclass
class FolderCorpus:
    x: np.ndarray          # (N, 16000) int16, centred/cropped to 1 s
    y: np.ndarray          # label ids into labels
    labels: list
    files: list
    noise: list            # long background recordings (int16 arrays)


def load_folder(root, expect=None, min_per_class: int = 1) -> FolderCorpus:
    root = Path(root)
    if not root.is_dir():
        raise EdgelearnError(f"{root}: not a directory", fix="give the folder that holds one sub-folder per word")
    classes = sorted(p.name for p in root.iterdir()
                     if p.is_dir() and (not p.name.startswith("_") or p.name in ("_silence_", "_unknown_")))
    if not classes:
        raise EdgelearnError(f"{root}: no class folders", fix="lay it out as ROOT/<word>/<clip>.wav")
    if expect:
        missing = [w for w in expect if w not in classes]
        if missing:
            raise EdgelearnError(f"{root}: missing class folder(s) {', '.join(missing)}",
                                 fix=f"add {root}/<word>/ with clips for each, or drop them from the word list")
    xs, ys, files, errors = [], [], [], []
    for k, c in enumerate(classes):
        wavs = sorted((root / c).glob("*.wav"))
        if len(wavs) < min_per_class:
            errors.append(f"{c}/: {len(wavs)} clips, need at least {min_per_class}")
        for w in wavs:
            try:
                pcm = read_wav(w, min_samples=1600)
            except AudioError as e:
                errors.append(str(e))
                continue
            xs.append(fit_to_window(pcm))
            ys.append(k)
            files.append(w)
    noise = []
    for d in root.iterdir():
        if d.is_dir() and d.name.startswith("_") and d.name not in classes:
            for w in sorted(d.glob("*.wav")):
                try:
                    noise.append(read_wav(w, min_samples=16000))
                except AudioError as e:
                    errors.append(str(e))
    if errors:
        shown = "\n  ".join(errors[:20]) + (f"\n  … and {len(errors) - 20} more" if len(errors) > 20 else "")
        # the list after the fix: the message is printed as "problem; fix", so a list in the problem
        # would leave the fix on a line of its own starting with ";", or on the last file's line
        raise EdgelearnError(f"{root}: {len(errors)} problem(s)",
                             fix=f"fix or remove these files (convert with `sox IN -r 16000 -c 1 -b 16 OUT.wav`):"
                                 f"\n  {shown}")
    return FolderCorpus(np.stack(xs), np.array(ys), classes, files, noise)
