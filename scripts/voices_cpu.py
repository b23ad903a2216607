"""CPU of the streaming detector with `export voices`, several source trees side by side (issue 17).

Bench ``kws_custom`` measures one tree's CPU once, beside whatever else the machine does. To compare
two versions of the code, this runs each tree's detector (bench ``kws_custom``'s taught state, its
four wake words taught other voices) over the first 10 minutes of its synthetic negatives in a fresh
process per tree, in turn, ``--rounds`` times, three passes each, and prints each pass's CPU per
second of audio and events (a tree is a checkout, e.g. ``git worktree add /tmp/old HEAD~1`` with
``.venv``, ``.cache`` and ``build`` linked into it).

    $ .venv/bin/python scripts/voices_cpu.py /tmp/old . [--rounds 2]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ONE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from bench import kws_custom as K
from edge.detect import detect_pcm
audio = K.render_audio()
pcm = np.concatenate([v for k, v in audio.items() if k.startswith("neg/")])[:16000 * 600]
det, _ = K.voices_system(audio).detector(keywords=[], replay=False)
detect_pcm(det, pcm[:16000 * 20])
for _ in range(3):
    det.reset()
    c0 = time.process_time()
    ev = detect_pcm(det, pcm)
    print(json.dumps({"tree": sys.argv[1], "cpu_ms_per_s": round(1000 * (time.process_time() - c0) / 600, 2),
                      "events": len(ev)}), flush=True)
"""


def main(argv: list[str]) -> int:
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 2
    trees = [str(Path(t).resolve()) for i, t in enumerate(argv) if not t.startswith("--")
             and (i == 0 or argv[i - 1] != "--rounds")]
    if not trees:
        raise SystemExit(__doc__)
    for _ in range(rounds):
        for tree in trees:
            out = subprocess.run([sys.executable, "-c", ONE, tree], capture_output=True, text=True, check=True)
            for line in out.stdout.splitlines():
                print(json.dumps(json.loads(line)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
