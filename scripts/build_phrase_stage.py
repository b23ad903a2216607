"""Build the base commands' phrase second stage into an existing bundle (issue 17; edge/phrase_stage.py).

``host.phrase_stage`` does the work (``edgelearn model`` runs it on the bundle it builds): two phrase
models per command (the ESPHome export's recipe with no user clip, seeds 0 and 1, ~1.5 min of CPU
each; or ``--models DIR,DIR`` where ``scripts/base_phrase_dev.py SEED`` trained them,
DIR/<command>/<command>.tflite, one directory per seed),
each command's cutoff chosen on development data only, the models and ``extra.phrase_stage`` written
into the bundle and the manifest signed again with the release key. ``--card-only`` rewrites the
model card's section from the bundle's ``extra.phrase_stage`` and signs again.

    $ .venv/bin/python scripts/build_phrase_stage.py --models build/base_phrase_s0,build/base_phrase_s1 \
          --bundle edge/models/kws-dscnn-s --key ~/.config/edgelearn/release.key [--after S] [--card-only]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from host.phrase_stage import AFTER_S  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="build_phrase_stage", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None,
                    help="trained models, one directory per seed, comma-separated (DIR/<command>/<command>.tflite)")
    ap.add_argument("--train", type=Path, default=None, help="train them into this directory instead")
    ap.add_argument("--bundle", type=Path, required=True, help="the bundle directory to add them to (edited in place)")
    ap.add_argument("--key", type=Path, required=True, help="the private key that signs the bundle (NAME.pub beside it)")
    ap.add_argument("--card-only", action="store_true",
                    help="only write the model card's section from the bundle's extra.phrase_stage and sign again")
    ap.add_argument("--after", type=float, default=AFTER_S,
                    help=f"seconds after the keyword end the stage judges (the detection's wait; default {AFTER_S:g})")
    a = ap.parse_args(argv)

    from host import phrase_stage as P

    if a.card_only:
        P.write_card(a.bundle, json.loads((a.bundle / "manifest.json").read_text())["extra"]["phrase_stage"], a.key)
        return 0
    files = None
    if a.models is not None:
        from edge.bundle import load_bundle

        labels = load_bundle(a.bundle, trusted_keys=a.key.with_suffix(".pub")).manifest["extra"]["labels12"]
        dirs = [Path(p) for p in a.models.split(",")]
        files = {c: [d / c / f"{c}.tflite" for d in dirs] for c in labels if not c.startswith("_")}
        missing = [str(f) for fs in files.values() for f in fs if not f.is_file()]
        if missing:
            raise SystemExit(f"build_phrase_stage: no model at {missing[0]}; train them (--train DIR) first")
    cfg = P.build(a.bundle, a.train or Path(tempfile.mkdtemp(prefix="phrase_models_")), a.key, files=files,
                  after_s=a.after)
    if cfg is None:
        return 1
    print(json.dumps({"cutoffs": cfg["cutoffs"], "fa_h": cfg["dev_fa_h"], "chosen_on": cfg["chosen_on"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
