"""Who may train now, and when the others should come back (pure functions of state and config).

Eligibility follows the production practice of Bonawitz et al. 2019
("Towards Federated Learning at Scale"): train only when the battery is
healthy or charging, on an unmetered network, not hot, on a supported tier,
with the current model. A fairness budget keeps the same always-plugged-in
devices from dominating: a device joins at most ``max_rounds_per_window`` of
the last ``fairness_window`` rounds, counting the rounds that selected it or
(``fairness_counts="contributions"``) the rounds that accepted its update, so a
device that answers first every time takes no more than its share and a slow
one whose upload came too late keeps its turn. Pace steering tells a device when to come
back so check-ins arrive at about the rate rounds need them, spread with
jitter so a fleet does not return in lockstep.

    ok, reason = eligible(state, cfg)
    wait = retry_after(reason, population=400, needed_per_s=0.5, cfg=cfg, rng=rng)
    n = plan_selection(10, history, cfg)     # adaptive over-selection from observed arrivals
"""

from __future__ import annotations

import math

METERED = ("cellular", "metered", "lora", "nbiot")


def eligible(state: dict, cfg) -> tuple[bool, str]:
    """(True, "ok") or (False, reason) for a device's reported state."""
    tier = state.get("tier", "linux")
    if tier not in cfg.tiers:
        return False, f"tier {tier!r} takes no part in training here"
    battery, charging = float(state.get("battery", 1.0)), bool(state.get("charging", False))
    if not charging and battery < cfg.min_battery:
        return False, f"battery {battery:.0%} below {cfg.min_battery:.0%} and not charging"
    if not cfg.allow_metered and str(state.get("network", "wifi")) in METERED:
        return False, f"network {state.get('network')!r} is metered"
    temp = state.get("temperature")
    if temp is not None and float(temp) > cfg.max_temperature:
        return False, f"temperature {float(temp):.0f} C above {cfg.max_temperature:.0f} C"
    return True, "ok"


def within_budget(recent_rounds: int, cfg) -> bool:
    """Fairness: joined (selected for, or contributed to: ``fairness_counts``) fewer than the allowed
    rounds in the recent window."""
    return recent_rounds < cfg.max_rounds_per_window


def retry_after(reason: str, population: int, needed_per_s: float, cfg, rng, until_next: float | None = None) -> float:
    """Seconds until the device should check in again.

    Devices that cannot train (battery, network, heat) come back later than
    ones that merely found the round full. The base interval spreads the known
    population so check-ins arrive at roughly ``needed_per_s``.
    """
    # twice the needed rate: some returning devices are busy or ineligible (over-subscription)
    base = population / (2 * needed_per_s) if needed_per_s > 0 else cfg.max_retry
    if until_next is not None:  # the round is full: come back about when the next one opens
        base = min(base, until_next)
    if reason.startswith(("battery", "temperature", "network")):
        base = max(base, 10 * cfg.min_retry)
    base = min(max(base, cfg.min_retry), cfg.max_retry)
    return float(base * rng.uniform(0.75, 1.25))  # jitter: no thundering herd


def arrival_stats(history: dict) -> tuple[int, list]:
    """(devices selected, sorted selection-to-upload latencies of those that uploaded, late ones included).

    ``history``: round id -> {"selected": n, "lat": {device id: seconds}}.
    """
    selected = sum(int(h["selected"]) for h in history.values())
    return selected, sorted(float(x) for h in history.values() for x in h["lat"].values())


def median_latency(history: dict, default: float) -> float:
    """Median seconds from selection to upload over recent rounds (``default`` without data)."""
    _, lat = arrival_stats(history)
    return lat[len(lat) // 2] if lat else default


def plan_selection(k: int, history: dict, cfg) -> int:
    """How many devices to select so that ``k`` updates arrive by about 1.25 × the median device latency.

    A fixed 130 % (Bonawitz et al. 2019) suits a few per cent of drop-outs;
    with 30 % dropping and a slow tail the quorum would only be met at the
    deadline. So the round learns: over the recent rounds, p = the fraction
    of selected devices whose upload arrived within 1.25 × the median
    latency. Late uploads (refused with 410) count as arrivals, so the
    latency distribution does not depend on how many were selected (else
    selecting more makes the accepted ones look faster and runs away).
    Select k × 1.25 / p (the 1.25 covers the binomial spread), kept between
    ``overselect`` and ``max_overselect`` times k.
    """
    lo = math.ceil(k * cfg.overselect)
    hi = max(lo, math.ceil(k * cfg.max_overselect))
    selected, lat = arrival_stats(history)
    if selected < 2 * k or not lat:   # too little evidence yet
        return lo
    t = 1.25 * lat[len(lat) // 2]
    p = sum(1 for x in lat if x <= t) / selected
    return int(min(hi, max(lo, math.ceil(1.25 * k / max(p, 1e-6)))))
