"""The kws_fewshot bench's reading rules: stream pieces that say the keyword (not negative speech for
it), and the intervals on its two-stage rates."""

import json

import numpy as np

from bench._fewshot_score import on_negative_speech, phonemes, says_as_words, says_keyword
from bench.kws_fewshot import bootstrap_ci


def test_a_piece_says_the_keyword_by_letters_or_by_sound_but_a_near_miss_does_not():
    assert says_keyword("cinnamon roll", "cinnamon") and says_keyword("magnets", "magnet")
    assert says_keyword("good knight", "good night") and says_keyword("doll fin", "dolphin")  # homophones
    for near_miss, phrase in (("bandana", "banana"), ("commuter", "computer"), ("blue ferry", "blueberry"),
                              ("hedge", "hey edge"), ("golfing", "dolphin")):
        assert not says_keyword(near_miss, phrase)
    assert phonemes("good knight") == phonemes("good night") != phonemes("good")
    # the stricter rule: as whole words only, so a piece that extends the keyword stays negative
    for piece, phrase in (("cinnamon roll", "cinnamon"), ("good knight", "good night"),
                          ("goodnight moon", "good night"), ("velvet rope", "velvet"), ("doll fin", "dolphin")):
        assert says_as_words(piece, phrase)
    for piece, phrase in (("magnets", "magnet"), ("dolphins", "dolphin"), ("thunderbolt", "thunder"),
                          ("bandana", "banana"), ("hedge", "hey edge")):
        assert says_keyword(piece, phrase) == (piece in ("magnets", "dolphins", "thunderbolt"))
        assert not says_as_words(piece, phrase)


def _res(voice, misses, held_out, fa2):
    # per-keyword result rows as evaluate_keywords makes them; only voice, misses 2-stage (8),
    # held-out (3) and FA 2-stage (9) are read
    return (voice, "phrase", 0, held_out, 0, 0, 0, [], misses, fa2)


def test_bootstrap_interval_holds_the_estimate_and_widens_with_spread_between_voices():
    same = [_res(v, 1, 10, 2) for v in "abcd" for _ in range(5)]   # every model alike: no spread
    assert bootstrap_ci(same, 2.0) == {"frr": [10.0, 10.0], "fa_per_hour": [1.0, 1.0]}
    mixed = [_res(v, m, 10, fa) for v, m, fa in (("a", 0, 0), ("b", 1, 1), ("c", 2, 4), ("d", 5, 9))
             for _ in range(5)]
    ci = bootstrap_ci(mixed, 2.0, n_boot=500)
    frr, fah = 100 * 8 / 40, (0 + 1 + 4 + 9) / 4 / 2.0
    assert ci["frr"][0] < frr < ci["frr"][1] and ci["fa_per_hour"][0] < fah < ci["fa_per_hour"][1]
    assert ci == bootstrap_ci(mixed, 2.0, n_boot=500)   # seeded: the bench's rows are reproducible
    assert 0.0 <= ci["frr"][0] and ci["frr"][1] <= 50.0 and ci["fa_per_hour"][1] <= 4.5  # the worst voice alone


def test_intervals_on_given_rates_follow_those_rates():
    res = [_res(v, 1, 10, 8) for v in "abcd" for _ in range(5)]   # 4 FA/h every event counted
    assert bootstrap_ci(res, 2.0)["fa_per_hour"] == [4.0, 4.0]
    assert bootstrap_ci(res, 2.0, fa_per_hour=[0.25] * len(res))["fa_per_hour"] == [0.25, 0.25]


def test_events_on_pieces_that_say_the_keyword_are_not_false_accepts_and_their_time_is_not_negative(tmp_path):
    # a stream timeline of three pieces (start s, end s, piece index into the sorted "neg|" keys)
    audio = {"neg|v|magnets|0": None, "neg|v|table|0": None, "neg|v|good knight|0": None}
    keys = sorted(audio)   # good knight, magnets, table
    (tmp_path / "stream-timeline.json").write_text(json.dumps(
        [[10.0, 11.0, keys.index("neg|v|magnets|0")], [20.0, 21.0, keys.index("neg|v|table|0")],
         [30.0, 32.0, keys.index("neg|v|good knight|0")]]))
    res = [_res("v", 0, 3, 0)[:1] + ("magnet",) + _res("v", 0, 3, 0)[2:],
           _res("w", 0, 3, 0)[:1] + ("magnet",) + _res("w", 0, 3, 0)[2:],
           _res("v", 0, 3, 0)[:1] + ("good night",) + _res("v", 0, 3, 0)[2:]]
    # voice v's "magnet" fires on "magnets" and "table"; w's on "table" twice; "good night" on its homophone
    fa = {"times2": [10.9, 20.9, 20.95, 21.0, 31.5], "phrases2": ["magnet", "magnet", "magnet", "magnet", "good night"],
          "voices2": ["v", "v", "w", "w", "v"], "times": [], "phrases": [], "voices": []}
    per_model, dropped = on_negative_speech(audio, tmp_path, res, fa, 1.0)
    magnet_h = 1.0 - 1.0 / 3600   # the hour less the second of "magnets"
    assert dropped == 2            # on "magnets" and on "good knight"
    np.testing.assert_allclose(per_model, [1 / magnet_h, 2 / magnet_h, 0.0])
    first, none = on_negative_speech(audio, tmp_path, res, fa, 1.0, stage=1)   # the first stage's own events
    assert none == 0 and not first.any()
    # with "magnets" kept as negative speech only the homophone's event goes
    strict, dropped = on_negative_speech(audio, tmp_path, res, fa, 1.0, says=says_as_words)
    assert dropped == 1
    np.testing.assert_allclose(strict, [2.0, 2.0, 0.0])
