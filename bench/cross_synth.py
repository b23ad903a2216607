"""Leave one synthesizer out: train without it, test on it, beside the model that trained with it.

Trains two extra encoders (same recipe, fewer epochs): one without Festival,
one without espeak-ng. Each is scored (12-class, fp32) on the voices of the
synthesizer it never heard, beside the shipped model's fp32 encoder (trained on
both) on the same clips. Flite, which no model trains on, is scored for all.
Takes ~15-25 minutes on 2 cores.

    $ edgelearn bench cross_synth
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.common import row, write_results

EPOCHS = int(os.environ.get("CROSS_SYNTH_EPOCHS", "40"))
MAX_MINUTES = float(os.environ.get("CROSS_SYNTH_MINUTES", "12"))


def main():
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from host.augment import features_for
    from host.data.corpus import build_corpus
    from host.evaluate import accuracy12
    from host.train import train

    corpus = build_corpus()
    work = Path("build") / "cross_synth"
    shipped = KeywordModel(load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys()),
                           "litert", precision="float32")
    eval_sets = {"festival": corpus.eval_clips(("train", "val", "test"), synths=("festival",)),
                 "espeak": corpus.eval_clips("test", synths=("espeak",)),
                 "flite": corpus.eval_clips("unseen")}

    def shipped_acc(which):
        x, y, _ = eval_sets[which]
        return accuracy12(shipped.infer(shipped.features(x))[1], y)

    def score(model, scale, which):
        x, y, _ = eval_sets[which]
        probs = model.predict(features_for(x, scale)[..., None], batch_size=1024, verbose=0)[1]
        return accuracy12(probs, y)

    rows = []
    for left_out, kept in (("festival", ("espeak",)), ("espeak", ("festival",))):
        res = train(work / f"without-{left_out}", epochs=EPOCHS, synths=kept, corpus=corpus,
                    max_minutes=MAX_MINUTES)
        m, scale = res["model"], res["scale"]
        acc, base = score(m, scale, left_out), shipped_acc(left_out)
        rows.append(row(f"without {left_out}", "acc12", acc, "fraction",
                        f"shipped model (trained with {left_out})", base, ratio=acc / base,
                        tested_on=f"every {left_out} voice" if left_out == "festival"
                        else "espeak-ng test-split voices", epochs=res["metrics"]["epochs_run"]))
        acc_f, base_f = score(m, scale, "flite"), shipped_acc("flite")
        rows.append(row(f"without {left_out}", "acc12_flite", acc_f, "fraction",
                        "shipped model on Flite", base_f, ratio=acc_f / base_f,
                        tested_on="Flite (no model trains on it)"))
    write_results("cross_synth", rows)


if __name__ == "__main__":
    main()
