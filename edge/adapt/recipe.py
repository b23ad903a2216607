"""Speaker adaptation of the base commands with negatives (issue 17): the recipe and its training set.

``device adapt --strategy full`` from 3 clips per command and nothing else lifts that voice's
recall to ~90 % but the tail forgets ``_unknown_``: 916-1,430 false accepts per hour on real
speech. The recipe chosen on development data (``scripts/adapt_recipe.py``, numbers in
docs/edge-runtime.md, "Speaker adaptation") keeps the place's own audio in every batch:

- ``training_windows``: the command clips, each ``augment`` times (shifted, sped up or slowed
  down, louder or softer, white noise at 5-30 dB: ``edge.adapt.ambient.augment``), any other
  labelled clips as they are, and the ambient windows (``ambient_windows`` of everyday audio
  that says none of the commands, the audio ``device calibrate`` reads) as ``_unknown_``, each
  also once more shifted, sped up or slowed down and, three times in four, under white noise
  (``noisy_ambient``: a noisy room plays the same speech under noise; without those copies the
  adapted commands fired 16 times an hour on real speech at 10 dB SNR, with them 1.2: development
  data);
- ``train_options``: batches with ``negative_share`` of ``_unknown_`` / ``_silence_``
  examples and the rest class-balanced over the commands (``edge.adapt.sampling``);
- ``SPEAKER``: the whole tail (``full``), Adam, ``steps`` steps;
- ``verify``: a second stage per command from the same clips (``edge.adapt.verified``: the
  custom keywords' time-order verifier), committed with the version.

``edge.device.Device.adapt(data, recipe="speaker", ambient=[...])`` (``edgelearn device adapt
--recipe speaker --ambient WAV...``) runs it: ``resolve`` gives the run's options (a named recipe,
overridden by what the caller set), ``training_windows`` the examples, ``train_options`` the batch
sampling.

    >>> opts = resolve("speaker", steps=500)                  # SPEAKER with 500 steps
    >>> w, y = training_windows(windows, y, km.labels, ambient=ambient_windows(["room.wav"]), augment=16)
    >>> train(trainer, cached_features(state, bb, km, w), y, store, "default", opts["steps"],
    ...       **train_options(km.labels))
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError

NEGATIVE_LABELS = ("_unknown_", "_silence_")
# chosen on development data only (scripts/adapt_recipe.py); docs/edge-runtime.md, "Speaker adaptation"
SPEAKER = {"strategy": "full", "optimizer": "adam", "steps": 1000, "augment": 16, "balance": True,
           "negative_share": 0.75, "negative_distill": 0.0, "verify": True, "noisy_ambient": True}
# what `device adapt` did before the recipe (and does without --recipe): the given clips as they are
PLAIN = {"strategy": "bias-only", "optimizer": "sgd", "steps": 200, "augment": 0, "balance": False,
         "negative_share": None, "negative_distill": 0.0, "verify": False, "noisy_ambient": False}
RECIPES = {"plain": PLAIN, "speaker": SPEAKER}


def resolve(recipe: str | None = None, **given) -> dict:
    """The options of one adaptation run: recipe ``recipe`` (None: ``plain``) with every option of
    ``given`` that is not None in its place. Unknown recipes and options are refused."""
    name = recipe or "plain"
    if name not in RECIPES:
        raise EdgelearnError(f"unknown adaptation recipe {name!r}", fix=f"use one of {sorted(RECIPES)}")
    unknown = sorted(set(given) - set(PLAIN))
    if unknown:
        raise EdgelearnError(f"unknown recipe options {unknown}", fix=f"use {sorted(PLAIN)}")
    for k, v in given.items():
        if v is not None and not _of_type(v, PLAIN[k]):
            like = SPEAKER[k]
            want = ("true or false" if isinstance(like, bool) else "a whole number" if isinstance(like, int)
                    else "a number" if isinstance(like, float) else "a name")
            raise EdgelearnError(f"recipe option {k}={v!r} is not {want}", fix=f"pass {k} as {want}, e.g. {like!r}")
    out = {**RECIPES[name], **{k: v for k, v in given.items() if v is not None}, "recipe": name}
    if out["augment"] < 0 or (out["negative_share"] is not None and not 0.0 <= out["negative_share"] < 1.0):
        raise EdgelearnError(f"augment {out['augment']} / negative share {out['negative_share']} out of range",
                             fix="pass augment >= 0 and a negative share in [0, 1)")
    return out


def _of_type(value, like) -> bool:
    """Whether an option's value has the type of its recipe default (an int is a number too, a bool
    is not; a None default, negative_share's, takes a number)."""
    if isinstance(like, bool) or isinstance(value, bool):
        return isinstance(like, bool) and isinstance(value, bool)
    if like is None or isinstance(like, float):
        return isinstance(value, (int, float, np.integer, np.floating))
    if isinstance(like, int):
        return isinstance(value, (int, np.integer))
    return isinstance(value, type(like))


def negative_ids(labels) -> tuple:
    labels = list(labels)
    return tuple(labels.index(w) for w in NEGATIVE_LABELS if w in labels)


def training_windows(windows, y, labels, ambient=None, augment: int = 0, seed: int = 0,
                     noisy_ambient: bool = False, speed=None, convert=None):
    """(int16 windows, label ids) of a speaker adaptation: the clips of word labels ``augment``
    times each (the clip itself first), the other labelled clips once, then ``ambient`` (1 s int16
    windows) as ``_unknown_``, with ``noisy_ambient`` followed by one augmented copy of each
    (``edge.adapt.ambient.augment``). ``speed``: the (low, high) range of the word copies' speed
    (pitch, formants and tempo together; None: ``augment``'s own); ``convert``: the share of them
    voice-converted first and its ranges (``augment``'s ``convert``). Deterministic in ``seed`` (the
    feature cache keys on the audio)."""
    from edge.adapt.ambient import augment as _augment

    windows, y = np.asarray(windows), np.asarray(y, np.int64)
    if len(windows) != len(y):
        raise EdgelearnError(f"{len(windows)} clips and {len(y)} labels", fix="one label per clip")
    neg = np.isin(y, negative_ids(labels))
    parts, ys = [], []
    if augment and augment > 1 and (~neg).any():
        kw = {} if speed is None else {"speed": tuple(speed)}
        parts.append(_augment(windows[~neg], int(augment), np.random.default_rng(seed), convert=convert, **kw))
        ys.append(np.repeat(y[~neg], int(augment)))
    else:
        parts.append(windows[~neg])
        ys.append(y[~neg])
    parts.append(windows[neg])
    ys.append(y[neg])
    if ambient is not None and len(ambient):
        if "_unknown_" not in list(labels):
            raise EdgelearnError("the bundle has no _unknown_ label for ambient audio", fix="adapt without --ambient")
        amb = np.asarray(ambient, windows.dtype)
        if noisy_ambient:
            amb = np.concatenate([amb, _augment(amb, 1, np.random.default_rng([seed, 1]), with_clip=False)])
        parts.append(amb)
        ys.append(np.full(len(amb), list(labels).index("_unknown_"), np.int64))
    return np.concatenate(parts), np.concatenate(ys)


def train_options(labels, balance: bool = True, negative_share: float | None = 0.75,
                  negative_distill: float = 0.0) -> dict:
    """Keyword arguments of ``edge.adapt.run.train`` for the recipe's sampling and distillation."""
    return {"balance": bool(balance), "negatives": negative_ids(labels), "negative_share": negative_share,
            "negative_distill": float(negative_distill)}
