"""PocketSphinx as a second opinion on short snippets: does this audio say WORD?

Runs INSIDE the peer virtualenv (.venv-peers): stdlib, numpy and pocketsphinx only. For each
snippet (a candidate's audio, ~1.5 s around where edgelearn's first stage heard a command), two
decodes with PocketSphinx's US-English acoustic model (trained on real speech):

- ``lm``: the words of the full-vocabulary decode (the bundled en-us trigram LM and CMUdict), so
  "yesterday" decodes as "yesterday", not "yes";
- ``kws``: for each threshold of a sweep, whether keyphrase search for WORD alone fires in the
  snippet (the keyword against PocketSphinx's phone loop: a likelihood ratio).

    python pocketsphinx_confirm.py JOB.json OUT.json

JOB:  {"npy": "/path/snippets.npy" (int16, the snippets end to end), "spans": [[a, b], ...] (sample
       offsets), "words": ["yes", ...], "thresholds": [1e-20, ...]}
       "lm_configs": {"lw2": {"lw": 2.0}, ...} (optional: more full-vocabulary decodes with other
       Decoder parameters), "nbest": 10 (optional: the n best hypotheses' words too)
OUT:  {"results": [{"lm": "the decoded words", "kws": [true, false, ...], "lm_lw2": "...",
       "nbest": ["...", ...]}, ...], "cpu_s": ..., "cpu_s_per_config": {"lw2": ...}}
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np
from pocketsphinx import Decoder


def main(job_path: str, out_path: str) -> int:
    job = json.loads(open(job_path).read())
    pcm = np.load(job["npy"]).astype(np.int16)
    words = [str(w) for w in job["words"]]
    thresholds = [float(t) for t in job.get("thresholds", [])]
    t0 = time.process_time()
    lm = Decoder(samprate=16000, loglevel="FATAL")
    more = {name: Decoder(samprate=16000, loglevel="FATAL", **cfg) for name, cfg in job.get("lm_configs", {}).items()}
    n_best = int(job.get("nbest", 0))
    kws = Decoder(samprate=16000, lm=None, loglevel="FATAL")
    names = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in sorted(set(words)):
            for i, t in enumerate(thresholds):
                path = os.path.join(tmp, f"{w}_{i}.kws")
                with open(path, "w") as f:
                    f.write(f"{w} /{t!r}/\n")
                names[(w, i)] = f"{w}_{i}"
                kws.add_kws(names[(w, i)], path)
    results, cpu = [], {}
    for (a, b), w in zip(job["spans"], words):
        raw = pcm[int(a):int(b)].tobytes()
        lm.start_utt()
        lm.process_raw(raw, False, True)
        lm.end_utt()
        hyp = lm.hyp()
        extra = {}
        if n_best:
            extra["nbest"] = [h.hypstr for h, _ in zip(lm.nbest(), range(n_best))]
        for name, dec in more.items():
            t1 = time.process_time()
            dec.start_utt()
            dec.process_raw(raw, False, True)
            dec.end_utt()
            h = dec.hyp()
            extra[f"lm_{name}"] = h.hypstr if h else ""
            cpu[name] = cpu.get(name, 0.0) + time.process_time() - t1
        fired = []
        for i in range(len(thresholds)):
            kws.activate_search(names[(w, i)])
            kws.start_utt()
            kws.process_raw(raw, False, True)
            kws.end_utt()
            fired.append(kws.hyp() is not None)
        results.append({"lm": hyp.hypstr if hyp else "", "kws": fired, **extra})
    with open(out_path, "w") as f:
        json.dump({"results": results, "cpu_s": time.process_time() - t0, "cpu_s_per_config": cpu}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
