"""The kws_fewshot bench's reading rules: stream pieces that say the keyword (left out of one FA/h
row), and the intervals on its two-stage rates."""

from bench._fewshot_score import phonemes, says_keyword
from bench.kws_fewshot import bootstrap_ci


def test_a_piece_says_the_keyword_by_letters_or_by_sound_but_a_near_miss_does_not():
    assert says_keyword("cinnamon roll", "cinnamon") and says_keyword("magnets", "magnet")
    assert says_keyword("good knight", "good night") and says_keyword("doll fin", "dolphin")  # homophones
    for near_miss, phrase in (("bandana", "banana"), ("commuter", "computer"), ("blue ferry", "blueberry"),
                              ("hedge", "hey edge"), ("golfing", "dolphin")):
        assert not says_keyword(near_miss, phrase)
    assert phonemes("good knight") == phonemes("good night") != phonemes("good")


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
