"""The rows bench ``fl_voices`` writes (moved out of it unchanged, 2026-12-05): command recall on clips
per system (schedule 0, with the federated versions' mean and worst over the repeated schedules), the
streaming Detector per system and operating point, and the bytes each codec uploads a round."""

from __future__ import annotations

import numpy as np

from bench.common import row


def result_rows(table, fleet_mean, spread, streaming, sims, dense_frame, real_hours, codecs, topk) -> list:
    """``table``: per system, its clip scores per voice group; ``fleet_mean``: per system, the mean over
    the fleet's voices; ``spread``: per codec, the schedules' gains; ``streaming``: per (system, point),
    recall per voice and real false accepts per hour; ``sims``: per codec, the schedule-0 run;
    ``dense_frame``: bytes of one dense float32 update; ``real_hours``: hours of real speech (or None)."""
    from host.fleet.voices import FLEET_VOICES, OUTSIDE_VOICES

    base = table["shipped model"]
    rows = []
    dense_name = f"federated (dense_f32, {sims['dense_f32']['rounds']} rounds)"
    for name, t in table.items():
        extra = {v: round(t[v]["balanced"], 4) for v in FLEET_VOICES + OUTSIDE_VOICES}
        codec = next((c for c in codecs if name.startswith(f"federated ({c},")), None)
        sched = spread.get(codec)  # this run is schedule 0; the mean and range over REPEATS schedules
        rows.append(row(f"{name}: held-out clips of the fleet's voices ({'/'.join(FLEET_VOICES)})",
                        "command recall (class-balanced, 10 commands, 1 s clips)", round(fleet_mean[name], 4),
                        "fraction", "shipped model", round(fleet_mean["shipped model"], 4), ratio=None,
                        per_voice=extra, gain_points=round(100 * (fleet_mean[name] - fleet_mean["shipped model"]), 1),
                        goal_gain_points=25 if name.startswith("federated") else None,
                        schedules=None if sched is None else sched["runs"],
                        gain_points_mean=None if sched is None else sched["fleet_mean"],
                        gain_points_worst=None if sched is None else min(r["fleet"] for r in sched["runs"])))
        for g in OUTSIDE_VOICES + ("test split",):
            what = f"voice outside the fleet (Flite {g})" if g != "test split" else \
                "the corpus test split (held-out espeak-ng / Festival voices)"
            rows.append(row(f"{name}: {what}", "command recall (class-balanced, 10 commands, 1 s clips)",
                            round(t[g]["balanced"], 4), "fraction", "shipped model", round(base[g]["balanced"], 4),
                            ratio=None, gain_points=round(100 * (t[g]["balanced"] - base[g]["balanced"]), 1),
                            false_accept_rate=None if t[g].get("fa") is None else round(t[g]["fa"], 4),
                            false_accept_rate_shipped=None if base[g].get("fa") is None else round(base[g]["fa"], 4),
                            accuracy37=round(t[g]["accuracy37"], 4) if "accuracy37" in t[g] else None,
                            goal_gain_points=(10 if g != "test split" else -1) if name.startswith("federated") else None,
                            gain_points_mean=None if sched is None else sched[f"{g}_mean"],
                            gain_points_worst=None if sched is None else min(r[g] for r in sched["runs"])))
    for (name, point), st in streaming.items():
        ref = streaming[("shipped model", point)]
        rows.append(row(f"{name}, streaming Detector at {point}: held-out commands of the fleet's voices",
                        "streaming command recall (class-balanced)",
                        round(float(np.mean([st[v] for v in FLEET_VOICES])), 4), "fraction", f"shipped model at {point}",
                        round(float(np.mean([ref[v] for v in FLEET_VOICES])), 4), ratio=None,
                        per_voice={v: round(st[v], 4) for v in FLEET_VOICES + OUTSIDE_VOICES},
                        real_fa_per_hour=None if "real speech FA/h" not in st else round(st["real speech FA/h"], 2),
                        real_fa_per_hour_shipped=None if "real speech FA/h" not in ref
                        else round(ref["real speech FA/h"], 2),
                        real_fa_hours=None if real_hours is None else round(real_hours, 3)))
    for codec, s in sims.items():
        per_round = s["bytes_up"] / max(1, s["rounds"])
        dense_round = dense_frame * s["uploads"] / max(1, s["rounds"])
        name = f"federated ({codec}, {s['rounds']} rounds)"
        rows.append(row(f"bytes uploaded per round, {codec}" + (f" (top {topk:.0%}, error feedback)" if codec == "topk_int8" else ""),
                        "bytes per round", round(per_round), "bytes", "dense float32 frames of the same updates",
                        round(dense_round), ratio=dense_round / per_round if per_round else None,
                        uploads=s["uploads"], rounds=s["rounds"], published=s["published"],
                        fleet_gain_points=round(100 * (fleet_mean[name] - fleet_mean["shipped model"]), 1),
                        dense_gain_points=round(100 * (fleet_mean[dense_name] - fleet_mean["shipped model"]), 1),
                        goal_ratio=32))
    return rows
