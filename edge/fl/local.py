"""A device's own examples for a federated round, assembled in one place (the agent and the fleet
simulator both call ``local_examples``), as embeddings of the bundle's frozen encoder:

- **labelled**: the clips the user gave (``DIR/<label>/*.wav`` or ``(windows, labels)``, what
  ``device adapt --data`` reads), the word clips ``augment`` times each (``edge.adapt.recipe.
  training_windows``: shifted, sped up or slowed down over ``FL_SPEED``, half of them voice-converted
  first (``FL_CONVERT``), louder or softer, noisy),
  ``_unknown_`` / ``_silence_`` clips once;
- **negatives**: ``ambient`` 1 s windows of audio the device heard that says no command (its
  user's other words, the room) as ``_unknown_``: the speaker recipe (issue 17) found that
  training without them makes false accepts explode;
- **pseudo-labelled**: the confident detections of the device itself, as ``Device.detect`` keeps
  them: base-keyword events scoring at least ``confirm`` (0.9) put their backbone output in the tail
  replay buffer (``replay_tail.bin``); here they become embeddings through the bundle's own (base)
  conv tail, the function the encoder computes, in float32;
- the embedding replay buffer (``replay.bin``), when anything wrote one.

    >>> X, y = local_examples(Device(state), "clips/", augment=8, ambient=ambient_windows(["room.wav"]))
    >>> X, y, source = local_examples(device, (windows, labels), detail=True)  # source per row
"""

from __future__ import annotations

from typing import Literal, overload

import numpy as np

SOURCES = ("labelled", "augmented", "ambient", "detected", "replay")
# The word copies' speed range (pitch, formants and tempo together): wider and higher than the speaker
# recipe's 0.9-1.12, since a round's update should carry past the fleet's own voices to other vocal
# tracts. Chosen on development renders (scripts/fl_sweep.py, twelve schedules, 2026-12-03): Flite slt,
# a voice outside the fleet, gained +17.4 points on average against +12.7 with 0.9-1.12, the fleet's
# voices +35.8 against +35.9; 0.85-1.25 gained less (+9.1 over six) and 0.95-1.45 cost the training
# Festival voices up to 2.6 points.
FL_SPEED = (0.9, 1.35)
# Half of those copies start from the clip voice-converted (``edge.adapt.vocoder``: pitch x1.5-2.0,
# formants x1.1-1.25, a shorter vocal tract than a man's), so a fleet of men also teaches the head
# women's and children's voices. Chosen on development renders (scripts/fl_sweep.py, twelve
# schedules, 2026-12-05): Flite slt, outside the fleet, +21.4 points on average against +17.3 without,
# the fleet's voices +37.1 against +35.9, the training Festival voices kept as well (1.50 against
# 1.59 points lost); the same pooled data trained centrally, slt +31 against +24.
FL_CONVERT = (0.5, (1.5, 2.0), (1.1, 1.25))


def _device(device):
    if hasattr(device, "keyword_model"):
        return device
    from edge.device import Device

    return Device(device)


def _embed(km, windows, batch: int = 256) -> np.ndarray:
    out = [np.asarray(km.infer(km.features(windows[a:a + batch]))[0], np.float32)
           for a in range(0, len(windows), batch)]
    return np.concatenate(out) if out else np.zeros((0, 64), np.float32)


def detected_examples(device) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings, labels) of the confident detections in the device's tail replay buffer
    (``Device.detect``'s weak labels), through the bundle's base conv tail."""
    from edge.adapt import Backbone, ConvTail, load_tail
    from edge.replay import TAIL_REPLAY, load_replay, slot_arrays

    rb = load_replay(device.state_dir / TAIL_REPLAY)
    if rb is None or not rb.count:
        return np.zeros((0, 64), np.float32), np.zeros(0, np.int64)
    slots = [s for s in range(rb.capacity) if rb.label_at(s) >= 0]
    x, y = slot_arrays(rb, slots)
    bb = Backbone(device.bundle, backend=device.backend)
    shape = tuple(int(d) for d in bb.backend.outputs[0].shape[1:])
    emb, _ = ConvTail(load_tail(device.bundle), qparams=bb.qparams).infer(
        np.asarray(x, np.float32).reshape((len(x),) + shape))
    return np.asarray(emb, np.float32), np.asarray(y, np.int64)


@overload
def local_examples(device, clips=None, *, augment: int = 0, ambient=None, detections: bool = True,
                   replay: bool = True, seed: int = 0, detail: Literal[False] = False, speed=FL_SPEED,
                   convert=FL_CONVERT) -> tuple[np.ndarray, np.ndarray]: ...


@overload
def local_examples(device, clips=None, *, augment: int = 0, ambient=None, detections: bool = True,
                   replay: bool = True, seed: int = 0, detail: Literal[True], speed=FL_SPEED,
                   convert=FL_CONVERT) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


def local_examples(device, clips=None, *, augment: int = 0, ambient=None, detections: bool = True,
                   replay: bool = True, seed: int = 0, detail: bool = False, speed=FL_SPEED,
                   convert=FL_CONVERT):
    """The device's examples for a federated round: ``(X, y)`` (float32 embeddings, label ids), and
    with ``detail`` also each row's source (one of ``SOURCES``).

    ``device``: an ``edge.device.Device`` or its state directory. ``clips``: labelled clips
    (a ``DIR/<label>/*.wav`` directory or ``(windows, labels)``; None: none). ``augment``: copies of
    each word clip (the clip itself first; 0 or 1: as they are), sped up or slowed down over
    ``speed`` (low, high; ``FL_SPEED``), a share voice-converted first (``convert``: ``FL_CONVERT``;
    None: none). ``ambient``: (N, 16000) int16
    windows that say no command, as ``_unknown_``. ``detections``: the confident detections of the
    tail replay buffer; ``replay``: the embedding replay buffer. Deterministic in ``seed``."""
    from edge.adapt.recipe import training_windows
    from edge.replay import EMBEDDING_REPLAY, load_replay, slot_arrays

    device = _device(device)
    km = device.keyword_model()
    xs, ys, src = [], [], []
    windows = y = None
    if clips is not None:
        from edge.device_data import load_labelled

        windows, y = load_labelled(km, clips)
    if windows is not None or (ambient is not None and len(ambient)):
        if windows is None:
            windows, y = np.zeros((0, 16000), np.int16), np.zeros(0, np.int64)
        w, yy = training_windows(windows, y, km.labels, ambient=ambient, augment=augment, seed=seed,
                                 speed=speed, convert=convert)
        n_neg = int(np.isin(y, [km.labels.index(n) for n in ("_unknown_", "_silence_") if n in km.labels]).sum())
        n_words = len(y) - n_neg
        copies = int(augment) if augment and augment > 1 and n_words else 1
        first = np.zeros(n_words * copies, bool)
        first[::copies] = True
        kind = np.concatenate([np.where(first, "labelled", "augmented"), np.full(n_neg, "labelled"),
                               np.full(len(w) - n_words * copies - n_neg, "ambient")])
        if len(w):
            xs.append(_embed(km, w))
            ys.append(np.asarray(yy, np.int64))
            src.append(kind)
    if detections:
        dx, dy = detected_examples(device)
        if len(dy):
            xs.append(dx)
            ys.append(dy)
            src.append(np.full(len(dy), "detected"))
    if replay:
        rb = load_replay(device.state_dir / EMBEDDING_REPLAY)
        if rb is not None and rb.count:
            slots = [s for s in range(rb.capacity) if rb.label_at(s) >= 0]
            rx, ry = slot_arrays(rb, slots)
            xs.append(np.asarray(rx, np.float32))
            ys.append(np.asarray(ry, np.int64))
            src.append(np.full(len(ry), "replay"))
    if xs:
        X, Y, S = np.concatenate(xs).astype(np.float32), np.concatenate(ys), np.concatenate(src)
    else:
        X, Y, S = np.zeros((0, 64), np.float32), np.zeros(0, np.int64), np.zeros(0, "<U9")
    return (X, Y, S) if detail else (X, Y)
