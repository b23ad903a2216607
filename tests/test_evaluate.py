"""12-class figures: plain accuracy on a split's own mix, class-balanced accuracy, command recall."""

from __future__ import annotations

import numpy as np
import pytest

from host.data.words import LABELS, SILENCE
from host.evaluate import accuracy12, balanced12, command_recall


def _onehot(ids):
    p = np.zeros((len(ids), len(LABELS)), np.float32)
    p[np.arange(len(ids)), ids] = 1.0
    return p


def test_always_unknown_scores_high_plain_but_one_class_balanced():
    # a split like the corpus's: 2 clips of each command, 80 clips of other words, 4 of silence
    cmds = [LABELS.index(w) for w in ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")]
    other = [LABELS.index(w) for w in ("cat", "dog", "bird", "tree")]
    y = np.array(cmds * 2 + other * 20 + [LABELS.index(SILENCE)] * 4)
    always_unknown = _onehot(np.full(len(y), LABELS.index("cat")))
    assert accuracy12(always_unknown, y) == pytest.approx(80 / 104)
    assert balanced12(always_unknown, y) == pytest.approx(1 / 12)   # only the unknown class is right
    assert command_recall(always_unknown, y) == 0.0


def test_balanced_weights_each_class_once_and_other_words_count_as_unknown():
    yes, no, cat, dog = (LABELS.index(w) for w in ("yes", "no", "cat", "dog"))
    y = np.array([yes, yes, yes, yes, no, cat, cat])
    pred = np.array([yes, yes, cat, cat, no, dog, cat])  # 'dog' for 'cat' is still "unknown": right
    p = _onehot(pred)
    assert accuracy12(p, y) == pytest.approx(5 / 7)
    assert balanced12(p, y) == pytest.approx((0.5 + 1.0 + 1.0) / 3)
    assert command_recall(p, y) == pytest.approx(3 / 5)


def test_command_recall_without_commands_is_nan():
    cat = LABELS.index("cat")
    assert np.isnan(command_recall(_onehot([cat]), np.array([cat])))
