"""``status_of``: the HTTP status shows the newest 50 rounds; a caller that counts rounds (the fleet
simulators) asks for every one. A simulated fleet with many failed rounds once reported 1 closed
round of 12 because the 12 were older than the newest 50."""

from __future__ import annotations

from aggregator_helpers import FakeClock
from host.aggregator.app import Aggregator, status_of
from host.aggregator.config import AggregatorConfig
from host.aggregator.inprocess import small_params
from host.aggregator.setup import init_state


def test_status_lists_the_newest_50_rounds_unless_asked_for_all(tmp_path):
    init_state(tmp_path / "agg", AggregatorConfig(round_timeout=10), params=small_params())
    clock = FakeClock()
    agg = Aggregator(tmp_path / "agg", clock)
    try:
        first = agg.rounds.round["round_id"]
        for _ in range(60):  # nobody uploads: each round fails at its deadline and the next opens
            clock.t += 11
            agg.rounds.tick()
        every = status_of(agg, rounds_limit=None)["rounds"]
        shown = status_of(agg)["rounds"]
    finally:
        agg.close()
    assert len(every) == 61 and {r["round_id"] for r in every} == set(range(first, first + 61))
    assert len(shown) == 50 and shown == every[:50]  # newest first
    assert sum(r["status"] == "open" for r in every) == 1
