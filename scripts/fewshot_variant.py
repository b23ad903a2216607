"""Experiment (issue 17): bench/kws_fewshot with an enrolment variant of ``scripts/enroll_noise.py``.

The bench as it is (its voices, streams, 2 h of noisy negative speech, the independent and fresh
checks), with the module settings of one named variant and, for variants with a ``bank_floor``,
the second stage's floor from the negative bank's windows applied to each keyword right after
``edge.enroll.enroll`` (``enroll_noise.bank_floors``). Results go to ``build/fewshot-variant/``,
never to ``bench/results``: this is the check a variant chosen on development data gets before it
is adopted, looked at once, not a place to choose.

    $ .venv/bin/python scripts/fewshot_variant.py "v8, floor at 0.8 of the bank's closest at 5-20 dB"   # ~45 min
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KNOWN = {"aug", "levels", "noisy_pass", "range_percentile", "bank_floor", "floor_levels"}


def main(argv) -> int:
    from scripts import enroll_noise as EN

    if len(argv) != 1 or argv[0] not in EN.VARIANTS:
        raise SystemExit(f"fewshot_variant: name one variant of scripts/enroll_noise.py, e.g. "
                         f"\"v8, floor at 0.8 of the bank's closest at 5-20 dB\" ({len(EN.VARIANTS)} there)")
    var = EN.VARIANTS[argv[0]]
    if set(var) - KNOWN:
        raise SystemExit(f"fewshot_variant: {argv[0]!r} changes {sorted(set(var) - KNOWN)}, which only "
                         "enroll_noise.py itself can run; pick a variant of thresholds and floors")
    import bench.common as C
    from bench import kws_fewshot
    from edge import enroll as E
    from edge import verify as V
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from scripts._custom_variants import bank as negative_bank

    E.AUGMENT_SNRS_DB = var["aug"]
    V.LEVELS_DB[V.VERSION], V.NOISY_PASS[V.VERSION] = var["levels"], var["noisy_pass"]
    V.RANGE_PERCENTILE[V.VERSION] = var.get("range_percentile", 10)
    if var.get("bank_floor"):
        bank = negative_bank(KeywordModel(load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())))
        plain = E.enroll

        def enroll(km, state, name, clips, *args, **kw):
            rep = plain(km, state, name, clips, *args, **kw)
            EN.bank_floors(state, bank[2], bank[0], bank[1], var["bank_floor"], levels=var.get("floor_levels"))
            return rep
        E.enroll = enroll
    C.RESULTS = Path(__file__).resolve().parents[1] / "build" / "fewshot-variant"
    kws_fewshot.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
