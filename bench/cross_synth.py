"""Leave one synthesizer out: train without it, test on it, beside the model that trained with it.

Trains two extra encoders (same recipe, fewer epochs): one without Festival,
one without espeak-ng. Each is scored (12-class, fp32) on every voice of the
synthesizer it never heard, beside the shipped recipe's model (trained on
both) on the same clips. Flite, which no model trains on, is scored for all.
Takes ~15-25 minutes on 2 cores.

    $ edgelearn bench cross_synth
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.common import row, write_results

EPOCHS = int(os.environ.get("CROSS_SYNTH_EPOCHS", "40"))


def main():
    import numpy as np
    from tensorflow import keras

    from host.augment import features_for
    from host.data.corpus import build_corpus
    from host.evaluate import accuracy12
    from host.train import train

    corpus = build_corpus()
    work = Path("build") / "cross_synth"
    full_dir = Path("build") / "kws"
    if not (full_dir / "model.keras").exists():
        train(full_dir, corpus=corpus)
    import json
    full = (keras.models.load_model(full_dir / "model.keras"),
            json.loads((full_dir / "frontend.json").read_text())["scale"])
    eval_sets = {"festival": corpus.eval_clips(("train", "val", "test"), synths=("festival",)),
                 "espeak": corpus.eval_clips("test", synths=("espeak",)),
                 "flite": corpus.eval_clips("unseen")}

    def score(model, scale, which):
        x, y, _ = eval_sets[which]
        probs = model.predict(features_for(x, scale)[..., None], batch_size=1024, verbose=0)[1]
        return accuracy12(probs, y)

    rows = []
    for left_out, kept in (("festival", ("espeak",)), ("espeak", ("festival",))):
        res = train(work / f"without-{left_out}", epochs=EPOCHS, synths=kept, corpus=corpus,
                    max_minutes=12)
        m, scale = res["model"], res["scale"]
        base = score(*full, left_out)
        rows.append(row(f"without {left_out}", "acc12", score(m, scale, left_out), "fraction",
                        f"trained with {left_out} (shipped recipe)", base,
                        ratio=score(m, scale, left_out) / base, tested_on=f"{left_out} voices",
                        epochs=res["metrics"]["epochs_run"]))
        flite_base = score(*full, "flite")
        rows.append(row(f"without {left_out}", "acc12_flite", score(m, scale, "flite"), "fraction",
                        "shipped recipe on Flite", flite_base, ratio=score(m, scale, "flite") / flite_base,
                        tested_on="flite (never trained)"))
    del np
    write_results("cross_synth", rows)


if __name__ == "__main__":
    main()
