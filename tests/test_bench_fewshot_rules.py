"""The kws_fewshot bench's rule for stream pieces that say the keyword (left out of one FA/h row)."""

from bench._fewshot_score import phonemes, says_keyword


def test_a_piece_says_the_keyword_by_letters_or_by_sound_but_a_near_miss_does_not():
    assert says_keyword("cinnamon roll", "cinnamon") and says_keyword("magnets", "magnet")
    assert says_keyword("good knight", "good night") and says_keyword("doll fin", "dolphin")  # homophones
    for near_miss, phrase in (("bandana", "banana"), ("commuter", "computer"), ("blue ferry", "blueberry"),
                              ("hedge", "hey edge"), ("golfing", "dolphin")):
        assert not says_keyword(near_miss, phrase)
    assert phonemes("good knight") == phonemes("good night") != phonemes("good")
