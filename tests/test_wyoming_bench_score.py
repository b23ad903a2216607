"""bench wyoming_latency's scoring: a detection belongs to the phrase whose end is due at most
``LEAD_S`` after it arrives (a detector may fire before the phrase's last loud frame is sent),
never to the phrase before it; each phrase is found once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench._wyoming_clients import CHUNK, GAP_S, LEAD_S, RATE, _score


def det(ts_ms=None):
    return SimpleNamespace(type="detection", data={"timestamp": ts_ms})


def test_an_early_detection_is_its_phrases_with_a_negative_latency():
    sent = [i * CHUNK / RATE for i in range(2000)]          # chunk i sent when its audio is due
    ends = [1.5, 1.5 + GAP_S, 1.5 + 2 * GAP_S]
    due = [sent[int(e * RATE) // CHUNK] for e in ends]
    got = [(due[0] + 0.2, det()),                           # late: phrase 0
           (due[1] - 0.3, det()),                           # early: phrase 1, not phrase 0 again
           (due[1] + 0.1, det()),                           # a second event of phrase 1: not counted
           (due[2] + GAP_S - LEAD_S + 0.1, det()),          # past phrase 2's window: nobody's
           (0.1, SimpleNamespace(type="not-detected", data={}))]
    lat, _, found = _score(sent, got, ends)
    assert found == 2 and lat == pytest.approx([0.2, -0.3])
