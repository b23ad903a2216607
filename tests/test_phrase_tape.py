"""One stream's phrase-model judgments sharing their work (edge/phrase_tape.py): a snippet that starts
the tape afresh gets ``snippet_peak``'s peak exactly; one that overlaps the audio judged before gets
the frames of the front end going on over the whole stretch and the models' outputs of one run over
them, exactly; two streams on one model each get their own; a gap starts afresh."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from ci_helpers import unavailable
from edge.kws import DEFAULT_BUNDLE, REPO_KEYS

SR = 16000

pytestmark = pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(),
                                reason="models/kws-dscnn-s not built yet (make model)")


@pytest.fixture(scope="module")
def model():
    from edge.phrase_stage import available

    if not available():
        unavailable("pymicro-features is not installed (the phrase extra)", "the phrase tape's tests")
    try:
        import ai_edge_litert  # noqa: F401
    except ImportError:
        unavailable("ai-edge-litert is not installed", "the phrase tape's tests")
    from edge.bundle import load_bundle
    from edge.phrase_stage import PhraseConfirm

    return PhraseConfirm(load_bundle(DEFAULT_BUNDLE, trusted_keys=REPO_KEYS)).models["off"]


@pytest.fixture(scope="module")
def stream():
    """~9 s: "off" and words around it said by espeak-ng, over a noise floor (int16)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed (scripts/bootstrap.sh installs it)")
    from host.data.synth import Voice, render

    clips = render(Voice("espeak", "en-us+f2"), [(t, 1.0, 1.0) for t in ("turn it off", "coffee", "off", "often", "offer", "off")])
    g = np.zeros(int(0.7 * SR), np.float32)
    x = np.concatenate([g] + [p for c in clips for p in (c.astype(np.float32), g)])
    x = x + np.random.default_rng(0).standard_normal(len(x)) * 3
    return np.clip(x, -32768, 32767).astype(np.int16)


def _fresh_outputs(model, feats):
    """The models' outputs over ``feats`` from a state no run reached (every output exact: fresh interpreters)."""
    from edge.phrase_stage import PhraseModel

    return PhraseModel(model.datas, model.name).outputs(feats)[0]


def _peak_of(out, origin, a, keyword_end, after, first_last):
    """The phrase stage's peak over outputs ``out`` of one run from stream sample ``origin``, for a
    snippet starting at sample ``a`` whose keyword ends ``keyword_end`` s into it."""
    from edge.phrase_stage import LO_S, SLIDING, STEP, STRIDE, WINDOW_SAMPLES

    best = 0.0
    for k in range(first_last, len(out)):
        e = ((origin - a) + (STRIDE * k + STRIDE - 1) * STEP + WINDOW_SAMPLES) / SR
        if keyword_end - LO_S <= e <= keyword_end + after:
            w = np.asarray(out[k - SLIDING + 1:k + 1], np.float32)
            best = max(best, float(np.convolve(w, np.ones(SLIDING) / SLIDING, mode="valid")[0]))
    return best


def _snip(x, t, before=2.0, after=0.3):
    a = int(round((t - before) * SR))
    return x[a:int(round((t + after) * SR))], a, (t * SR - a) / SR


def test_a_snippet_that_starts_the_tape_gets_snippet_peak_exactly(model, stream):
    from edge.phrase_stage import snippet_peak, snippet_peaks
    from edge.phrase_tape import Tape

    for t in (2.1, 3.05, 4.4, 6.0):
        tape = Tape()
        pcm, a, end = _snip(stream, t)
        assert tape.peak(model, pcm, a, end, 0.3) == snippet_peak(model, pcm, end, 0.3)
        assert (tape.fresh, tape.continued) == (1, 0)
        # each model's own peak too (a quiet snippet's lone sure model: edge.custom_voices.SINGLE)
        tape = Tape()
        both = tape.peak(model, pcm, a, end, 0.3, each=True)
        assert both == snippet_peaks(model, pcm, end, 0.3) and len(both[1]) == len(model.datas) == 2
        assert min(both[1]) <= both[0] <= max(both[1])   # the mean's best window lies between the models'
    peaks = [snippet_peak(model, *_snip(stream, t)[::2], 0.3) for t in np.arange(2.0, len(stream) / SR - 0.3, 0.25)]
    assert max(peaks) > 0.5 > min(peaks)   # the stream has the word and has not: the equality means something


def test_overlapping_snippets_get_one_front_end_and_one_run_of_the_models(model, stream):
    """Snippets 0.4 s apart: each after the first goes on from the tape. Its peak is the one of the
    front end started at the first snippet's start and run over everything since, and of the models'
    outputs of one fresh run over those frames (past its warm-up)."""
    from edge.phrase_stage import WARMUP, features
    from edge.phrase_tape import FIRST_LAST, Tape

    tape = Tape()
    times = np.arange(2.3, len(stream) / SR - 0.3, 0.4)
    origin = _snip(stream, times[0])[1]
    got, want = [], []
    for t in times:
        pcm, a, end = _snip(stream, t)
        got.append(tape.peak(model, pcm, a, end, 0.3))
        whole = stream[origin:a + len(pcm)]
        out = _fresh_outputs(model, features(whole))
        want.append(_peak_of(out, origin, a, end, 0.3, max(FIRST_LAST, WARMUP + 4)))
    assert (tape.fresh, tape.continued) == (1, len(times) - 1)
    assert got == want
    assert max(got) > 0.5


def test_a_snippet_judged_after_a_later_one_reads_the_kept_frames(model, stream):
    """A held candidate's snippet judged after a later one (a watch and the slot): the front end is not
    started again over audio it has read (it was, 85 times in 10 min of bench speech, a third more
    front-end work); the peak is what judging the snippets in stream order gives."""
    from edge.phrase_tape import Tape

    times = [2.3, 3.1, 2.7, 3.9, 3.5, 3.3]
    in_order = Tape()
    want = {t: in_order.peak(model, *_snip(stream, t)[:2], _snip(stream, t)[2], 0.3) for t in sorted(times)}
    tape = Tape()
    got = {t: tape.peak(model, *_snip(stream, t)[:2], _snip(stream, t)[2], 0.3) for t in times}
    assert got == want
    assert (tape.fresh, tape.continued) == (1, len(times) - 1)
    # one that starts before the kept frames still starts afresh
    pcm, a, end = _snip(stream, 2.25)
    assert a < tape.origin
    tape.peak(model, pcm, a, end, 0.3)
    assert tape.fresh == 2


def _gated_runs(ensemble, stream, monkeypatch, bounds):
    """Each snippet's peak on a tape without ``bound`` and with each of ``bounds``: every gated peak is
    the exact one where that reaches the bound and an upper bound under the bound elsewhere (so a
    cutoff at the bound decides as before). Returns the inferences each model ran without a bound, and
    with each bound."""
    from edge.phrase_stage import PhraseModel
    from edge.phrase_tape import Tape

    ran = [0] * len(ensemble.datas)
    member = PhraseModel._member

    def counted(self, m, q):
        ran[m] += len(q) // 3
        return member(self, m, q)

    monkeypatch.setattr(PhraseModel, "_member", counted)
    times = np.arange(2.3, len(stream) / SR - 0.3, 0.1)
    tape = Tape()
    exact = [tape.peak(ensemble, *_snip(stream, t)[:2], _snip(stream, t)[2], 0.3) for t in times]
    whole, each = list(ran), []
    for bound in bounds:
        assert min(exact) < bound <= max(exact)
        ran[:] = [0] * len(ran)
        tape = Tape()
        gated = [tape.peak(ensemble, *_snip(stream, t)[:2], _snip(stream, t)[2], 0.3, bound=bound) for t in times]
        for e, g in zip(exact, gated):
            assert g == e if e >= bound else e <= g < bound
        each.append(list(ran))
    return whole, each


def test_the_second_model_runs_only_where_the_mean_may_reach_the_cutoff(model, stream, monkeypatch):
    """``bound``: the ensemble's second model runs only over windows where the first one's sliding
    mean lets the mean of two reach it. Where the peak reaches ``bound`` it is the peak exactly, and
    under it an upper bound still under it: a cutoff at ``bound`` decides as before."""
    whole, each = _gated_runs(model, stream, monkeypatch, (0.8, 0.95))
    for ran in each:
        assert ran[0] == whole[0] and 0 < ran[1] < whole[1], (ran, whole)


def test_with_three_models_each_one_runs_only_where_the_models_so_far_leave_the_cutoff_reachable(model, stream,
                                                                                                 monkeypatch):
    """An ensemble of three (``export voices`` since session 51): the second model runs where the first
    one's mean leaves the cutoff reachable, the third only where the first two's do, each decision as
    without the bound. (Above 2/3: under it the first model alone never rules a window out.)"""
    from edge.phrase_stage import PhraseModel

    trio = PhraseModel(list(model.datas) + [model.datas[0]], "off")   # a third draw: the first again
    whole, each = _gated_runs(trio, stream, monkeypatch, (0.7, 0.8, 0.9))
    assert whole[0] == whole[1] == whole[2] > 0
    for ran in each:
        assert ran[0] == whole[0] and 0 < ran[2] < ran[1] < whole[1], (ran, whole)


def test_two_streams_on_one_model_each_get_their_own_outputs(model, stream):
    """Two Wyoming clients share a keyword's models: interleaved, each tape's peaks are its own alone."""
    from edge.phrase_tape import Tape

    other = np.roll(stream, 20011)
    times = np.arange(2.3, len(stream) / SR - 0.3, 0.5)

    def alone(x):
        tape = Tape()
        return [tape.peak(model, *_snip(x, t)[:2], _snip(x, t)[2], 0.3) for t in times]

    want_a, want_b = alone(stream), alone(other)
    ta, tb, got_a, got_b = Tape(), Tape(), [], []
    for t in times:
        pa, aa, ea = _snip(stream, t)
        pb, ab, eb = _snip(other, t)
        got_a.append(ta.peak(model, pa, aa, ea, 0.3))
        got_b.append(tb.peak(model, pb, ab, eb, 0.3))
    assert got_a == want_a and got_b == want_b
    assert want_a != want_b


def test_a_gap_starts_the_front_end_afresh(model, stream):
    from edge.phrase_stage import snippet_peak
    from edge.phrase_tape import Tape

    tape = Tape()
    pcm, a, end = _snip(stream, 2.4)
    tape.peak(model, pcm, a, end, 0.3)
    pcm, a, end = _snip(stream, 6.5)           # starts 1.8 s after the first one ended
    assert a + len(pcm) <= len(stream)
    assert tape.peak(model, pcm, a, end, 0.3) == snippet_peak(model, pcm, end, 0.3)
    assert (tape.fresh, tape.continued) == (2, 0)
    tape.reset()
    assert tape.fe is None and tape.fresh == 0
