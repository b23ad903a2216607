"""A fleet of devices whose users speak with voices the shipped model never trained on.

Each device is one user (a CMU Flite voice: no model trains on Flite, ``host.data.corpus`` puts
it in the ``unseen`` split) in one room (a synthetic impulse response, RT60 0.15-0.5 s, and
white or pink room noise at 15-35 dB SNR), with the data a user would really have:

- ``labelled``: ``labelled_per_command`` recordings per command (rates 0.9-1.1, the user's own
  pitch) and 10 s of room noise (``_silence_``), what ``device adapt --data`` reads;
- ``ambient``: 1 s windows of the user's other words (not labels of the model), ``_unknown_``;
- ``heard``: a stream of what the device heard since: ``heard_per_command`` more renders of each
  command and some other words, with pauses; ``Device.detect`` over it keeps its confident
  detections as pseudo-labels (``edge.fl.local``);
- ``voice`` and ``room`` for held-out clips in the same conditions (``heldout_clips``).

Users who share a voice differ in pitch and room. Other words are split by a hash of the word:
half 0 is what devices hear (ambient, heard), half 1 what held-out clips say, so a held-out
``_unknown_`` clip is never a word any device trained on.

    >>> devices = make_fleet(6, voices=("awb", "rms", "kal16"), seed=0)
    >>> x, y = heldout_clips("slt", seed=1)          # a voice outside the fleet
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edge.fl.local import FL_CONVERT, FL_SPEED

FLEET_VOICES = ("awb", "rms", "kal16")   # Flite voices the fleet's users speak with
OUTSIDE_VOICES = ("slt",)                # a Flite voice no device holds (Flite's only female voice)
SR = 16000


def _words():
    from host.data import synth as S
    from host.data.words import LABELS

    return [w for w in (Path(S.__file__).parent / "phone_words.txt").read_text().split()
            if w not in LABELS and w.isalpha()]


def word_half(word: str) -> int:
    return hashlib.sha1(("fleet-word:" + word).encode()).digest()[0] % 2


@dataclass
class Room:
    rt60: float
    colour: str
    snr_db: float
    seed: int

    @classmethod
    def draw(cls, rng) -> "Room":
        return cls(float(rng.uniform(0.15, 0.5)), str(rng.choice(["white", "pink"])),
                   float(rng.uniform(15, 35)), int(rng.integers(1 << 30)))

    def apply(self, pcm: np.ndarray, rng) -> np.ndarray:
        """Reverberation, then room noise at the room's SNR (float32)."""
        from host.data import noise as N

        h = N.room_impulse(np.random.default_rng(self.seed), self.rt60)
        x = np.convolve(pcm.astype(np.float32), h)[:len(pcm)]
        nz = N.coloured_noise(rng, self.colour, (1, len(x)))[0]
        return N.mix_at_snr(x[None], nz[None], [self.snr_db])[0]

    def noise(self, rng, n: int) -> np.ndarray:
        from host.data import noise as N

        return N.coloured_noise(rng, self.colour, (1, n))[0] * float(rng.uniform(30, 300))


@dataclass
class VoiceDevice:
    voice: str
    pitch: float
    room: Room
    labelled: tuple            # (windows (N, 16000) int16, label names)
    ambient: np.ndarray        # (M, 16000) int16: the user's other words
    heard: np.ndarray          # int16 stream of commands and other words
    heard_spans: list = field(default_factory=list)   # [(start_s, end_s, word)] in ``heard``


def _clip(room: "Room", pcm: np.ndarray, rng) -> np.ndarray:
    """One utterance in the room, with its reverberation tail (0.3 s)."""
    return _window(room.apply(np.pad(pcm.astype(np.float32), (0, int(0.3 * SR))), rng))


def _window(x: np.ndarray) -> np.ndarray:
    from edge.features import fit_to_window

    return fit_to_window(np.clip(np.rint(x), -32768, 32767).astype(np.int16))


def _render(voice: str, jobs):
    from host.data import synth as S

    return S.render(S.Voice("flite", voice), jobs)


def make_device(voice: str, seed: int, labelled_per_command: int = 4, heard_per_command: int = 6,
                ambient_words: int = 30, heard_words: int = 20, silence_s: int = 10) -> VoiceDevice:
    from host.data.words import COMMANDS10

    rng = np.random.default_rng([seed, 17])
    pitch = float(rng.uniform(0.85, 1.2))
    room = Room.draw(rng)
    words = [w for w in _words() if word_half(w) == 0]
    rates = np.linspace(0.9, 1.1, labelled_per_command) if labelled_per_command > 1 else [1.0]
    jobs = [(w, float(r), pitch) for w in COMMANDS10 for r in rates]
    amb = [(str(w), float(rng.uniform(0.85, 1.15)), pitch) for w in rng.choice(words, ambient_words, replace=False)]
    heard = [(w, float(rng.uniform(0.8, 1.25)), pitch * float(rng.uniform(0.95, 1.05)))
             for w in COMMANDS10 for _ in range(heard_per_command)]
    heard += [(str(w), float(rng.uniform(0.85, 1.15)), pitch) for w in rng.choice(words, heard_words, replace=False)]
    order = rng.permutation(len(heard))
    heard = [heard[i] for i in order]
    pcm = _render(voice, jobs + amb + heard)
    n1, n2 = len(jobs), len(jobs) + len(amb)
    lab_w = [_clip(room, p, rng) for p in pcm[:n1]]
    lab_y = [w for w, _, _ in jobs]
    for _ in range(silence_s):
        lab_w.append(_window(room.noise(rng, SR)))
        lab_y.append("_silence_")
    ambient = np.stack([_clip(room, p, rng) for p in pcm[n1:n2]])
    parts, spans, at = [], [], 0
    for (w, _, _), p in zip(heard, pcm[n2:]):
        gap = np.zeros(int(rng.uniform(0.8, 1.5) * SR), np.float32)
        parts += [gap, p.astype(np.float32)]
        at += len(gap)
        spans.append((at / SR, (at + len(p)) / SR, w))
        at += len(p)
    parts.append(np.zeros(SR, np.float32))
    stream = room.apply(np.concatenate(parts), rng) + rng.standard_normal(at + SR).astype(np.float32) * 3.0
    stream = np.clip(np.rint(stream), -32768, 32767).astype(np.int16)
    return VoiceDevice(voice, pitch, room, (np.stack(lab_w), lab_y), ambient, stream, spans)


def make_fleet(n_devices: int, voices=FLEET_VOICES, seed: int = 0, **kw) -> list[VoiceDevice]:
    """``n_devices`` users, the voices taking turns; each its own pitch and room."""
    return [make_device(voices[i % len(voices)], seed * 1000 + i, **kw) for i in range(n_devices)]


def heldout_clips(voice: str, seed: int, per_command: int = 8, other_words: int = 30):
    """Held-out 1 s clips of ``voice``: ``per_command`` fresh renders of every command (rate 0.8-1.25,
    pitch 0.85-1.2, each in a freshly drawn room) and ``other_words`` words no device hears
    (``_unknown_``). Returns (windows int16, label names)."""
    from host.data.words import COMMANDS10

    rng = np.random.default_rng([seed, 29])
    words = [w for w in _words() if word_half(w) == 1]
    jobs = [(w, float(rng.uniform(0.8, 1.25)), float(rng.uniform(0.85, 1.2)))
            for w in COMMANDS10 for _ in range(per_command)]
    jobs += [(str(w), float(rng.uniform(0.85, 1.15)), float(rng.uniform(0.85, 1.2)))
             for w in rng.choice(words, other_words, replace=False)]
    pcm = _render(voice, jobs)
    x = np.stack([_clip(Room.draw(rng), p, rng) for p in pcm])
    y = [w if w in COMMANDS10 else "_unknown_" for w, _, _ in jobs]
    return x, y


def prepare_devices(devices: list[VoiceDevice], root, augment: int = 8, confirm: float = 0.9,
                    bundle=None, progress: bool = False, extra_ambient=None, speed=None,
                    convert=FL_CONVERT) -> list[dict]:
    """Each user's device as the agent would have it: a fresh ``edge.device.Device`` state under
    ``root/devI``, the heard stream run through ``Device.detect`` (its confident detections, at
    ``confirm``, are kept in the tail replay buffer), then ``edge.fl.local.local_examples`` of the
    labelled clips (``augment`` x), the ambient windows (plus ``extra_ambient[i]``: more everyday
    audio of device i's place, e.g. real speech) and those detections (``speed``: the augmented
    copies' speed range, None: ``edge.fl.local.FL_SPEED``; ``convert``: their voice conversion,
    ``edge.fl.local.FL_CONVERT`` unless told otherwise, None: none). Per device:
    ``{"device", "X", "y", "source", "detections": {"events", "kept", "kept_correct"}}``."""
    import sys

    from edge.device import Device
    from edge.fl.local import local_examples

    out = []
    for i, d in enumerate(devices):
        dev = Device(Path(root) / f"dev{i}", bundle)
        events = list(dev.detect(source=d.heard, confirm=confirm, replay=True))
        kept = [e for e in events if e["score"] >= confirm]
        right = sum(any(a - 0.1 <= e["time_s"] <= b + 1.0 and w == e["keyword"] for a, b, w in d.heard_spans)
                    for e in kept)
        amb = d.ambient if extra_ambient is None else np.concatenate([d.ambient, extra_ambient[i]])
        X, y, src = local_examples(dev, d.labelled, augment=augment, ambient=amb, seed=i, detail=True,
                                   speed=FL_SPEED if speed is None else tuple(speed), convert=convert)
        out.append({"device": dev, "voice": d.voice, "X": X, "y": y, "source": src,
                    "detections": {"events": len(events), "kept": len(kept), "kept_correct": int(right)}})
        if progress:
            print(f"\rfleet voices: device {i + 1}/{len(devices)} ({d.voice}) {len(y)} examples, "
                  f"{len(kept)} detections kept", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return out


def command_recall(logits, y, labels) -> dict:
    """Class-balanced recall of the 10 commands from (N, labels) ``logits`` and label ids ``y``, with
    each command's recall, the share of ``_unknown_`` clips named as a command (``fa``) and the
    plain accuracy over every label."""
    from host.data.words import COMMANDS10

    y = np.asarray(y)
    p = np.asarray(logits).argmax(1)
    cmd = [labels.index(w) for w in COMMANDS10]
    per = {w: float(np.mean(p[y == c] == c)) for w, c in zip(COMMANDS10, cmd) if (y == c).any()}
    unk = y == labels.index("_unknown_")
    return {"balanced": float(np.mean(list(per.values()))), "per_word": per,
            "fa": float(np.mean(np.isin(p[unk], cmd))) if unk.any() else None,
            "accuracy37": float(np.mean(p == y))}
