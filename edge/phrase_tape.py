"""One stream's phrase-model judgments sharing their work: the front end and each model run once over
audio that several candidates' snippets cover.

Why: a custom keyword taught other voices opens its candidates well under its own threshold
(``edge.custom_voices.LOWER_REAL`` logit: 1 in session 47, 3 since session 49), and in speech that is
most of a second apart or less; each is judged on
2.3 s of audio (``edge.phrase_stage``), so judged one by one the TFLite Micro front end (three
quarters of a judgment's CPU) and the models ran over the same audio two or three times. A ``Tape``
belongs to one stream (one ``edge.detect.Detector``): it keeps the front end's frames of the audio
judged last and the front end's state, and each model's streaming state where it stopped, so the
next snippet that overlaps them computes only its new audio.

What changes against a fresh snippet (``edge.phrase_stage.snippet_peak``): a snippet that overlaps
the tape gets the frames of a front end that started earlier (its noise estimate and PCAN gains
warmed on the audio before, as ESPHome's runs on a device; a few per cent on the frames of the
window judged, ~1.7 s into the snippet). A snippet that does not overlap (a gap, the first of a
stream) starts the front end afresh at its first sample, so its peak is ``snippet_peak``'s exactly.
The models' outputs are exact either way: the streaming state is a shift register of the last
``RECEPTIVE_S`` of frames (``PhraseModel``), so continuing it gives the outputs a fresh run over the
same frames would; a model judged by another stream since (two Wyoming clients share one model)
runs again from the frames it needs (``PhraseModel.run``'s token).
"""

from __future__ import annotations

import itertools

import numpy as np

from edge import phrase_stage as PS

KEEP_FRAMES = 400               # 4 s of frames kept: a snippet is 2.3 s
KEEP_OUTPUTS = KEEP_FRAMES // PS.STRIDE
# the phrase stage's rule (``PhraseModel.peak_features``): a window counts once its last output's
# window ends RECEPTIVE_S + (SLIDING - 1) strides past its run's first frame: FIRST_LAST outputs in
FIRST_LAST = next(k for k in itertools.count() if ((PS.STRIDE * k + PS.STRIDE - 1) * PS.STEP + PS.WINDOW_SAMPLES)
                  / PS.SAMPLE_RATE >= PS.RECEPTIVE_S + (PS.SLIDING - 1) * PS.STRIDE * PS.STEP / PS.SAMPLE_RATE)
_runs = itertools.count(1)


class _Run:
    """One model's outputs over the tape's frames from output ``start`` of the tape's epoch (output k
    reads frames 3k..3k+2): those before ``start + WARMUP`` are 0, as a fresh snippet's first are;
    ``out[0]`` is output ``base`` (older ones are dropped), the ensemble's mean, and ``each[0]`` its
    models' own; ``token`` names the model's state after the last output (``PhraseModel.run``)."""

    def __init__(self, epoch: int, start: int):
        self.epoch, self.start, self.base, self.out, self.each = epoch, start, start, [], []
        self.token = (next(_runs), start)

    @property
    def next(self) -> int:
        return self.base + len(self.out)


class Tape:
    """The front end's int8 frames of one stream's judged audio (``frames``), and each model's outputs
    over them (``peak``). Positions are stream samples (the Detector's ``samples`` clock)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.fe, self.epoch = None, 0
        self.origin = 0            # the stream sample where the epoch's frame 0's window starts
        self.fed = 0               # stream samples given to the front end (origin + a multiple of STEP)
        self.first = 0             # the epoch's frame index of rows[0]
        self.rows = np.zeros((0, 40), np.int8)
        self.runs: dict[int, _Run] = {}
        self.fresh = self.continued = 0   # snippets that started the front end afresh / went on from it

    def _restart(self, at: int) -> None:
        from pymicro_features import MicroFrontend

        self.fe, self.epoch = MicroFrontend(), self.epoch + 1
        self.origin = self.fed = at
        self.first, self.rows, self.runs = 0, np.zeros((0, 40), np.int8), {}
        self.fresh += 1

    def frames(self, pcm: np.ndarray, at: int) -> int:
        """Make the frames of ``pcm`` (int16, starting at stream sample ``at``) exist: the front end goes
        on where it stopped if that is inside the snippet, else starts afresh at ``at``. Returns the
        epoch's index of the first frame whose window starts at or after ``at``."""
        end = at + len(pcm)
        if self.fe is None or not (at <= self.fed <= end) or at < self.origin + PS.STEP * self.first:
            self._restart(at)
        else:
            self.continued += 1
        n = (end - self.fed) // PS.STEP
        if n > 0:
            data = np.ascontiguousarray(pcm[self.fed - at:self.fed - at + PS.STEP * n], dtype="<i2").tobytes()
            new, step = [], PS.STEP * 2
            for i in range(0, len(data), step):   # as edge.phrase_stage.features feeds it
                r = self.fe.process_samples(data[i:i + step])
                if r.features:
                    new.append(r.features)
            self.fed += PS.STEP * n
            if new:
                self.rows = np.concatenate([self.rows, PS.quantize(np.asarray(new, np.float32).reshape(-1, 40))])
            drop = len(self.rows) - KEEP_FRAMES
            if drop > 0:
                self.rows, self.first = self.rows[drop:], self.first + drop
        return -(-(at - self.origin) // PS.STEP)

    def _run_for(self, model, need_from: int, k_first: int) -> _Run:
        """``model``'s run on this epoch if it can give outputs from ``need_from`` on, else a new one
        that reaches ``need_from`` past its warm-up (from the snippet's first output at the earliest); a
        new one too where going on would run more outputs than a warm-up."""
        run = self.runs.get(id(model))
        keep_from = -(-self.first // PS.STRIDE)   # the first output whose frames are still kept
        if run is None or run.epoch != self.epoch or run.next < keep_from or need_from < run.base \
                or need_from < run.start + PS.WARMUP or run.next < need_from - PS.WARMUP:
            run = self.runs[id(model)] = _Run(self.epoch, max(k_first, need_from - PS.WARMUP))
        return run

    def peak(self, model: "PS.PhraseModel", pcm: np.ndarray, at: int, keyword_end_s: float, after_s: float,
             each: bool = False):
        """``PhraseModel.peak`` of the snippet ``pcm`` (starting at stream sample ``at``, its keyword
        ending ``keyword_end_s`` into it; ``pcm`` reaches ``after_s`` past that), on the tape; with
        ``each``, (that, each model's own peak: ``PhraseModel.peaks``)."""
        j0 = self.frames(pcm, at)
        k_first = -(-j0 // PS.STRIDE)                          # the snippet's first output
        ks = np.arange(k_first, (self.first + len(self.rows)) // PS.STRIDE)
        # where each output's window ends, s from the snippet's start (as PhraseModel.outputs has it)
        e = ((self.origin - at) + (PS.STRIDE * ks + PS.STRIDE - 1) * PS.STEP + PS.WINDOW_SAMPLES) / PS.SAMPLE_RATE
        want = ks[(e >= keyword_end_s - PS.LO_S) & (e <= keyword_end_s + after_s)]   # windows' last outputs
        if not len(want):
            return (0.0, [0.0] * len(model.datas)) if each else 0.0
        need_from, k1 = int(want[0]) - (PS.SLIDING - 1), int(want[-1]) + 1
        run = self._run_for(model, need_from, k_first)
        if run.next < k1:
            q = self.rows[PS.STRIDE * run.next - self.first:PS.STRIDE * k1 - self.first]
            out = model.run(q, run.token if run.out else None, (run.token[0], k1))
            if out is None:   # another stream moved the model's state since: this snippet's outputs afresh
                run = self.runs[id(model)] = _Run(self.epoch, max(k_first, need_from - PS.WARMUP))
                q = self.rows[PS.STRIDE * run.start - self.first:PS.STRIDE * k1 - self.first]
                out = model.run(q, None, (run.token[0], k1))
            out, every = out
            warm = max(0, run.start + PS.WARMUP - run.next)
            out[:warm] = 0.0
            every[:, :warm] = 0.0
            run.out.extend(out.tolist())
            run.each.extend(every.T.tolist())
            run.token = (run.token[0], k1)
            drop = len(run.out) - KEEP_OUTPUTS
            if drop > 0:
                del run.out[:drop], run.each[:drop]
                run.base += drop
        best, best_each, ones = 0.0, [0.0] * len(model.datas), np.ones(PS.SLIDING) / PS.SLIDING
        for k in want.tolist():
            if k >= run.start + FIRST_LAST and k - (PS.SLIDING - 1) >= run.base:
                i = k - run.base
                win = np.asarray(run.out[i - PS.SLIDING + 1:i + 1], np.float32)   # the mean as peak_features takes it
                best = max(best, float(np.convolve(win, ones, mode="valid")[0]))
                if each:
                    wins = np.asarray(run.each[i - PS.SLIDING + 1:i + 1], np.float32).T
                    best_each = [max(b, float(np.convolve(w, ones, mode="valid")[0])) for b, w in zip(best_each, wins)]
        return (best, best_each) if each else best
