"""How bench/kws_custom.py scores every system the same way, and the rows it writes of a score.

A system is ``events_of(name, pcm) -> events``; ``score`` runs it over the positive streams (the
miss rate per voice and SNR: a phrase heard between its clip's start - 0.1 s and its end + 1 s)
and the negatives (false accepts per hour per wake word: synthetic, real, real under noise);
``fair_thresholds`` finds each phrase's lowest threshold at ``FA_GOAL``; ``events_at`` turns a
peer's probability trace into events. The phrases, the enrolling voice, the SNRs and the goal are
here, and bench/kws_custom.py imports them (and re-exports every name).

    >>> r = score(events_of, streams, negs, real, noisy)
    >>> rows = condition_rows("openwakeword at default threshold (0.5)", r)
"""

from __future__ import annotations

import numpy as np

from bench import _base_streams as B
from bench.common import row

PHRASES = ("hey jarvis", "alexa", "hey mycroft", "okay nabu")
NOISY_SNRS = (20, 10)  # the real test half also under noise, each level scored as its own stream
USER = ("flite", "awb")
SNRS = (None, 20, 10, 5)
FA_GOAL = 0.5


def events_at(trace: dict, threshold: float, keyword: str, refractory_s: float = 1.0) -> list[dict]:
    """A peer's probability trace -> events where it exceeds ``threshold`` (one per refractory)."""
    t, p = np.asarray(trace["t"]), np.asarray(trace["p"])
    return B.refractory([{"keyword": keyword, "time_s": float(x)} for x in t[p > threshold]], refractory_s)


def score(events_of, streams, negs, real, noisy=None) -> dict:
    """events_of(name, pcm) -> events; FRR per (voice group, snr), FA/h synthetic, real, and real
    under noise (``noisy``)."""
    res = {"positives": {}, "fa": {}}
    for (vid, snr), (pcm, spans, clips) in streams.items():
        ev = events_of(f"pos_{vid}_{snr}", pcm)
        res["positives"][f"{vid}|{snr}"] = B.score_positives(ev, spans, clips, words=PHRASES, noisy=snr is not None)
    for kind, parts in (("synthetic", negs), ("real", real), ("noisy", noisy)):
        if not parts:
            continue
        n = hours = 0
        kws = {}
        for name, pcm in parts.items():
            ev = events_of(name, pcm)
            n += len(ev)
            hours += len(pcm) / 16000 / 3600
            for e in ev:
                kws[e["keyword"]] = kws.get(e["keyword"], 0) + 1
        res["fa"][kind] = {"fa": n, "hours": hours, "fa_per_hour": n / hours / len(PHRASES), "keywords": kws}
    return res


def frr(res, group: str, snrs=SNRS, users=(USER,), noise: str | None = None) -> float:
    """Miss rate over the enrolling voices ("user": ``users``) or the other voices, at the given SNRs;
    ``noise``: of the clips under that noise alone (white, pink, babble: ``score_positives``' by_noise)."""
    enrolled = {f"{u[0]}:{u[1]}" for u in users}
    hits = n = 0
    for key, r in res["positives"].items():
        vid, snr = key.split("|")
        snr = None if snr == "None" else int(snr)
        if snr in snrs and ((vid in enrolled) == (group == "user")):
            if noise is None:
                hits += r["recall"] * r["n"]
                n += r["n"]
            elif noise in r.get("by_noise", {}):    # clip i under COLOURS[i % 3]
                k = len(range(B.COLOURS.index(noise), r["n"], len(B.COLOURS)))
                hits += r["by_noise"][noise] * k
                n += k
    return 1.0 - hits / n


def fair_thresholds(score_negatives, grid) -> dict | None:
    """{phrase: the lowest value of ``grid`` at which that phrase's false accepts on the synthetic
    negatives are <= FA_GOAL per hour} (each wake word its own), or None if some phrase has none.
    ``score_negatives(values)`` scores the negatives with {phrase: value}."""
    chosen = {}
    for v in grid:
        fa = score_negatives({ph: v for ph in PHRASES})["fa"]["synthetic"]
        for ph in PHRASES:
            if ph not in chosen and fa["keywords"].get(ph, 0) / fa["hours"] <= FA_GOAL:
                chosen[ph] = v
        if len(chosen) == len(PHRASES):
            return chosen
    return None


def system_rows(system: str, default: dict, fair, fair_thr, cpu_ms: float, cpu_note: str | None = None) -> list[dict]:
    rows = []
    for label, r, thr in (("default", default, "default"), ("fair", fair, fair_thr)):
        if r is None:
            rows.append(row(f"{system} at its fair threshold", "false-reject rate", None, "fraction",
                            note=f"no threshold tried gives <= {FA_GOAL} FA/h on the synthetic negatives"))
            continue
        shown = ", ".join(f"{k} {v}" for k, v in thr.items()) if isinstance(thr, dict) else thr
        rows += condition_rows(f"{system} at {label} threshold ({shown})", r)
    rows.append(row(f"{system}: CPU per second of audio (4 wake words)", "cpu", round(cpu_ms, 2), "ms/s",
                    **({"note": cpu_note} if cpu_note else {})))
    return rows


def condition_rows(where: str, r: dict, users=(USER,)) -> list[dict]:
    """FRR (enrolling voices, other voices; clean, 5-20 dB) and false accepts of one scored run."""
    rows = []
    mine = "the enrolment voice" if len(users) == 1 else f"the enrolling voices ({', '.join(u[1] for u in users)})"
    for group in ("user", "others"):
        for snrs, cond in (((None,), "clean"), ((20, 10, 5), "5-20 dB")):
            split = cond != "clean" and any("by_noise" in p for p in r["positives"].values())
            by_noise = {"by_noise": {c: round(frr(r, group, snrs, users, c), 4) for c in B.COLOURS}} if split else {}
            rows.append(row(f"{where}: {mine if group == 'user' else 'other voices'}, {cond}",
                            "false-reject rate", round(frr(r, group, snrs, users), 4), "fraction", "goal",
                            0.10 if group == "user" else 0.30, ratio=None, **by_noise))
    for kind in ("synthetic", "real", "noisy"):
        if kind not in r["fa"]:
            continue
        fa = r["fa"][kind]
        what = {"noisy": f"real negative speech under {' and '.join(map(str, NOISY_SNRS))} dB noise"}.get(
            kind, f"{kind} negative speech")
        rows.append(row(f"{where}: {what} ({fa['hours'] * 60:.0f} min)",
                        "false accepts per hour per wake word", round(fa["fa_per_hour"], 3), "FA/h", "goal",
                        FA_GOAL, ratio=None, events=fa["fa"], keywords=fa["keywords"]))
    return rows
