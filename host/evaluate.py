"""Evaluation shared by training, quantisation and the benchmarks.

12-class accuracy (10 commands + unknown + silence) from 37-way predictions, plain and
class-balanced (the Speech Commands protocol's mix), command recall,
and few-shot separability of phrases the model never saw: nearest-prototype
accuracy with k enrolment clips per phrase, on cosine-normalised embeddings.

    >>> acc = accuracy12(probs, y)
    >>> fs = fewshot_accuracy(emb, phrase_ids, shots=5)
"""

from __future__ import annotations

import numpy as np

from host.data.words import COMMANDS10, LABELS, LABELS12, label12

_MAP12 = np.array([LABELS12.index(label12(w)) for w in LABELS])


def to12(label_ids: np.ndarray) -> np.ndarray:
    return _MAP12[np.asarray(label_ids)]


def accuracy12(probs: np.ndarray, y: np.ndarray) -> float:
    """Accuracy on the 12-class task: the model's top label, mapped (any other word -> unknown).

    This is what a device does with the posteriors (it reports the top label).
    Summing the 26 non-command posteriors into "unknown" instead biases
    uncertain commands towards unknown.
    """
    return float((to12(np.asarray(probs).argmax(1)) == to12(y)).mean())


def balanced12(probs: np.ndarray, y: np.ndarray) -> float:
    """12-class accuracy with every class present weighted equally: the mean of per-class recall.

    The corpus's splits keep every word of the 35, so about 80 % of a split is ``_unknown_`` and
    plain accuracy mostly measures unknown-rejection. The Speech Commands test protocol (Warden
    2018) holds roughly as many unknown and silence clips as clips of each command, which is this
    figure on a split with any class mix.
    """
    t, p = to12(y), to12(np.asarray(probs).argmax(1))
    return float(np.mean([(p[t == k] == k).mean() for k in np.unique(t)]))


def command_recall(probs: np.ndarray, y: np.ndarray) -> float:
    """Share of the 10 commands' clips whose top label is the right command."""
    t, p = to12(y), to12(np.asarray(probs).argmax(1))
    cmd = t < len(COMMANDS10)
    return float((p[cmd] == t[cmd]).mean()) if cmd.any() else float("nan")


def accuracy35(probs: np.ndarray, y: np.ndarray) -> float:
    return float((np.asarray(probs).argmax(1) == np.asarray(y)).mean())


def fewshot_accuracy(emb: np.ndarray, phrase: np.ndarray, shots: int = 5, trials: int = 20,
                     seed: int = 0) -> float:
    """Nearest-prototype accuracy: enrol every phrase from `shots` random clips, classify the rest.

    Clips of a phrase come from several held-out voices, so the shots and the
    test clips are usually different speakers: harder than a device that its
    owner enrols, which makes it a conservative separability figure.
    """
    e = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-9)
    rng = np.random.default_rng(seed)
    phrases = np.unique(phrase)
    hits = total = 0
    for _ in range(trials):
        protos, tests = [], []
        for k, p in enumerate(phrases):
            r = rng.permutation(np.nonzero(phrase == p)[0])
            if len(r) <= shots:
                raise ValueError(f"phrase {p!r} has {len(r)} clips, need more than {shots}")
            protos.append(e[r[:shots]].mean(0))
            tests.append((r[shots:], k))
        P = np.stack(protos)
        P /= np.linalg.norm(P, axis=1, keepdims=True)
        for rows, k in tests:
            hits += int(((e[rows] @ P.T).argmax(1) == k).sum())
            total += len(rows)
    return hits / total
