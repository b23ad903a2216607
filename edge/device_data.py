"""The labelled clips and everyday audio a device adapts and federates on: ``Device.adapt``, the
agent's local training and ``edge.fl.local`` read them through these, so a bad folder or clip gets
the same one-sentence error everywhere.

    >>> windows, y = load_labelled(km, "data/")            # DIR/<label>/*.wav
    >>> windows, y = load_labelled(km, (clips, ["yes", "no"]))
    >>> amb = ambient_of(["kitchen.wav"])                   # (N, 16000) int16 windows or None
"""

from __future__ import annotations

import os
from pathlib import Path

from edge.errors import EdgelearnError


def is_path(x) -> bool:
    return isinstance(x, (str, os.PathLike))


def load_labelled(km, data):
    """``data`` -> (windows (N, 16000) int16, label indices (N,)): a directory DIR/<label>/*.wav, or
    (clips, labels)."""
    import numpy as np

    from edge.audio import read_wav
    from edge.features import fit_to_window

    if isinstance(data, tuple) and len(data) == 2 and not is_path(data[0]):
        return labelled_arrays(km, *data)
    root = None if data is None else Path(data)
    if root is None or not root.is_dir():
        raise EdgelearnError(f"--data {root} is not a directory", fix="pass DIR with DIR/<label>/*.wav")
    xs, ys = [], []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if d.name not in km.labels:
            raise EdgelearnError(f"{d}: {d.name!r} is not a label of the bundle", fix=f"use one of {km.labels}")
        for f in sorted(d.glob("*.wav")):
            xs.append(fit_to_window(read_wav(f, min_samples=1600)))
            ys.append(km.labels.index(d.name))
    if not xs:
        raise EdgelearnError(f"no WAV clips under {root}/<label>/", fix="add labelled clips")
    return np.stack(xs), np.array(ys)


def ambient_of(ambient):
    """``ambient`` (WAV paths, or (N, 16000) int16 windows, or None) -> windows or None."""
    import numpy as np

    if ambient is None:
        return None
    if isinstance(ambient, np.ndarray):
        if ambient.ndim != 2 or ambient.shape[1] != 16000:
            raise EdgelearnError(f"ambient windows of shape {ambient.shape}", fix="pass (N, 16000) int16 windows")
        return ambient if len(ambient) else None
    from edge.adapt.ambient import ambient_windows

    paths = [ambient] if is_path(ambient) else list(ambient)
    return ambient_windows(paths) if paths else None


def labelled_arrays(km, clips, labels):
    """(clips, labels) given in memory -> (windows (N, 16000) int16, label indices (N,)); labels are
    the bundle's words or their indices."""
    import numpy as np

    from edge.audio import to_int16
    from edge.features import fit_to_window

    clips, labels = list(clips), list(labels)
    if not clips or len(clips) != len(labels):
        raise EdgelearnError(f"adapt got {len(clips)} clips and {len(labels)} labels",
                             fix="pass (clips, labels) with one label per clip")
    ys = []
    for lab in labels:
        if isinstance(lab, str) and lab in km.labels:
            ys.append(km.labels.index(lab))
        elif isinstance(lab, (int, np.integer)) and not isinstance(lab, bool) and 0 <= lab < len(km.labels):
            ys.append(int(lab))
        else:
            raise EdgelearnError(f"{lab!r} is not a label of the bundle", fix=f"use one of {km.labels} or its index")
    xs = []
    for i, c in enumerate(clips):
        c = np.asarray(c)
        if c.ndim != 1 or len(c) < 1600:
            raise EdgelearnError(f"clip {i + 1} is not at least 0.1 s of mono 16 kHz samples (shape {c.shape})",
                                 fix="pass one 1-D int16 array per clip")
        xs.append(fit_to_window(c if c.dtype == np.int16 else to_int16(c)))
    return np.stack(xs), np.array(ys)
