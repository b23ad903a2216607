"""Experiment (issue 17, session 44): how long a passed command must wait for an enrolled keyword.

With keywords enrolled, the default Detector holds a command its phrase stage passed for a refractory
period (1 s past its keyword end), so that an enrolled phrase that starts like the command ("lights
on" after "left") takes it over; commands then come ~0.65 s later. Since session 44 a held command
comes out once nothing has been said for ``edge.detect.QUIET_S`` past its keyword end. Development
check: enrolled phrases that start like a command, each enrolled from 5 renders of a voice and
streamed as 6 other renders of it between commands said alone (``bench._base_streams.
positive_stream``: 1.5 s apart over a microphone's noise floor), with no hold, the whole wait and
the early release; an event naming the phrase is a hit, one naming a command a loss. Also each
command said alone between the phrases: how soon it comes out.

    $ .venv/bin/python scripts/enrolled_hold_dev.py      # ~5 min
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import edge  # noqa: E402
from bench._base_streams import Clip, positive_stream  # noqa: E402
from edge import detect as D  # noqa: E402
from host.data import synth  # noqa: E402

PHRASES = ["lights on", "stop the music", "go to sleep", "yes please", "upstairs light", "no more music",
           "offline mode", "right away", "down the hall"]
VOICES = [("flite", "rms"), ("espeak", "en-us+m1")]
RATES = ((0.9, 1.0), (1.0, 0.95), (1.1, 1.05), (0.95, 1.1), (1.05, 0.9), (1.0, 1.0), (0.97, 1.03), (1.03, 0.97),
         (0.92, 1.05), (1.08, 0.95), (1.0, 1.08))
SR = 16000


def run(st, pcm, quiet):
    D.QUIET_S = quiet
    det, _ = edge.Device(st).detector(replay=False)
    if quiet is None:  # no hold at all: decided as soon as the snippet is whole
        det._wait = det._after
    out = []
    for i in range(0, len(pcm), 1600):
        out += [(e, det.samples / SR) for e in det.push(pcm[i:i + 1600])]
    return out + [(e, det.samples / SR) for e in det.flush()]


shipped = D.QUIET_S
tot = {"no hold": [0, 0, []], "whole wait": [0, 0, []], "early release": [0, 0, []]}
for kind, name in VOICES:
    voice = synth.Voice(kind, name)
    for ph in PHRASES:
        clips = synth.render(voice, [(ph, r, p) for r, p in RATES])
        cmds = synth.render(voice, [(w, 1.0, 1.0) for w in ("left", "stop", "go", "yes", "up", "no")])
        st = Path(tempfile.mkdtemp()) / "st"
        edge.Device(st).enroll(ph, clips[:5])
        mixed = [c for pair in zip(clips[5:], cmds) for c in pair]
        pcm, spans = positive_stream([Clip(name, "", c) for c in mixed])
        for label, q in (("no hold", None), ("whole wait", 1e9), ("early release", shipped)):
            evs = run(st, pcm, q)
            hit = sum(any(e["keyword"] == ph and a - 0.1 <= e["time_s"] <= b + 0.3 for e, _ in evs)
                      for (a, b) in spans[0::2])
            lost = sum(any(e["keyword"] != ph and a - 0.1 <= e["time_s"] <= b + 0.3 for e, _ in evs)
                       for (a, b) in spans[0::2])
            delays = [n - e["time_s"] for e, n in evs if e["keyword"] != ph
                      and any(a - 0.1 <= e["time_s"] <= b + 0.3 for (a, b) in spans[1::2])]
            tot[label][0] += hit
            tot[label][1] += lost
            tot[label][2] += delays
            print(f"{name:>9} {ph!r:>17} {label:>13}: phrase heard {hit}/6, a command instead {lost}/6, "
                  f"commands alone out after {np.median(delays) if delays else float('nan'):.2f} s", flush=True)
for label, (hit, lost, delays) in tot.items():
    n = 6 * len(PHRASES) * len(VOICES)
    print(f"{label}: phrases heard {hit}/{n}, a command instead {lost}/{n}; commands said alone out "
          f"p50 {np.median(delays):.2f} s, p90 {np.percentile(delays, 90):.2f} s after their keyword end ({len(delays)})")
