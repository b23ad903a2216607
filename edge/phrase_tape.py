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
window judged, ~1.7 s into the snippet). So does a snippet judged after a later one whose frames
are still kept (a watched keyword's and the slot's candidates, ``edge.detect_voices``; session 50:
starting afresh there re-read a third more audio). A snippet that does not overlap (a gap, the first
of a stream, one older than the kept frames) starts the front end afresh at its first sample, so its
peak is ``snippet_peak``'s exactly.
The models' outputs are exact either way: the streaming state is a shift register of the last
``RECEPTIVE_S`` of frames (``PhraseModel``), so continuing it gives the outputs a fresh run over the
same frames would; a model judged by another stream since (two Wyoming clients share one model)
runs again from the frames it needs (``PhraseModel.run``'s token).

Each model of an ensemble runs on its own (session 50). Where the caller only compares the peak
with a cutoff (``Tape.peak``'s ``bound``; ``edge.custom_voices.Voices`` at medium and low), each
model after the first runs only over the windows where those before it leave the ensemble's mean
able to reach the cutoff (each model still to run adds at most 1 to the sum; since session 51 model
by model, for the three draws ``export voices`` trains against real speech): every decision is the
same to the bit. With two models at 0.95 the second ran about 1 % as often as the first on speech
(bench `kws_custom`'s negatives, 10 min: 642 inferences against 76,452).
"""

from __future__ import annotations

import itertools

import numpy as np

from edge import phrase_stage as PS

KEEP_OUTPUTS = 400 // PS.STRIDE   # 4 s of each model's outputs kept: a snippet is 2.3 s
# and the frames of those and of a warm-up before them: a second model (run only where the mean may
# reach the cutoff) starts a warm-up before the first window it is needed for
KEEP_FRAMES = PS.STRIDE * (KEEP_OUTPUTS + PS.WARMUP + PS.SLIDING)
# the phrase stage's rule (``PhraseModel.peak_features``): a window counts once its last output's
# window ends RECEPTIVE_S + (SLIDING - 1) strides past its run's first frame: FIRST_LAST outputs in
FIRST_LAST = next(k for k in itertools.count() if ((PS.STRIDE * k + PS.STRIDE - 1) * PS.STEP + PS.WINDOW_SAMPLES)
                  / PS.SAMPLE_RATE >= PS.RECEPTIVE_S + (PS.SLIDING - 1) * PS.STRIDE * PS.STEP / PS.SAMPLE_RATE)
_runs = itertools.count(1)


class _Run:
    """One model's outputs over the tape's frames from output ``start`` of the tape's epoch (output k
    reads frames 3k..3k+2): those before ``start + WARMUP`` are 0, as a fresh snippet's first are;
    ``out[0]`` is output ``base`` (older ones are dropped); ``token`` names the model's state after
    the last output (``PhraseModel.run``)."""

    def __init__(self, epoch: int, start: int):
        self.epoch, self.start, self.base, self.out = epoch, start, start, []
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
        on where it stopped if that is inside the snippet or after it (a snippet judged after a later
        one, whose frames are still kept), else starts afresh at ``at``. Returns the epoch's index of
        the first frame whose window starts at or after ``at``."""
        end = at + len(pcm)
        if self.fe is None or at > self.fed or at < self.origin + PS.STEP * self.first:
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

    def _run_for(self, key, need_from: int, start: int) -> _Run:
        """``key``'s run (a model of an ensemble) on this epoch if it can give outputs from
        ``need_from`` on, else a new one from ``start``; a new one too where going on would run more
        outputs than a warm-up."""
        run = self.runs.get(key)
        keep_from = -(-self.first // PS.STRIDE)   # the first output whose frames are still kept
        if run is None or run.epoch != self.epoch or run.next < keep_from or need_from < run.base \
                or need_from < run.start + PS.WARMUP or run.next < need_from - PS.WARMUP:
            run = self.runs[key] = _Run(self.epoch, start)
        return run

    def _outputs(self, model, m: int, need_from: int, k1: int, start: int) -> _Run:
        """Model ``m`` of ``model``'s run holding its outputs ``need_from`` .. ``k1`` - 1 (a new run
        from ``start`` where the kept one cannot give them)."""
        key = (id(model), m)
        run = self._run_for(key, need_from, start)
        if run.next < k1:
            q = self.rows[PS.STRIDE * run.next - self.first:PS.STRIDE * k1 - self.first]
            out = model.run(m, q, run.token if run.out else None, (run.token[0], k1))
            if out is None:   # another stream moved the model's state since: these outputs afresh
                run = self.runs[key] = _Run(self.epoch, start)
                q = self.rows[PS.STRIDE * run.start - self.first:PS.STRIDE * k1 - self.first]
                out = model.run(m, q, None, (run.token[0], k1))
            out[:max(0, run.start + PS.WARMUP - run.next)] = 0.0
            run.out.extend(out.tolist())
            run.token = (run.token[0], k1)
            drop = len(run.out) - KEEP_OUTPUTS
            if drop > 0:
                del run.out[:drop]
                run.base += drop
        return run

    def peak(self, model: "PS.PhraseModel", pcm: np.ndarray, at: int, keyword_end_s: float, after_s: float,
             each: bool = False, bound: float | None = None):
        """``PhraseModel.peak`` of the snippet ``pcm`` (starting at stream sample ``at``, its keyword
        ending ``keyword_end_s`` into it; ``pcm`` reaches ``after_s`` past that), on the tape; with
        ``each``, (that, each model's own peak: ``PhraseModel.peaks``).

        With ``bound`` (the cutoff the caller compares it with) and no ``each``, each model after the
        first runs only over the windows where the sliding means of those before it let the
        ensemble's mean reach ``bound`` (a mean of two reaches 0.95 only where the first model's
        reaches 0.9; of three, 0.85 only where the first's reaches 0.55 and the first two's sum 1.55):
        where the peak reaches ``bound`` it is the peak exactly, else it is an upper bound under ``bound``."""
        j0 = self.frames(pcm, at)
        k_first = -(-j0 // PS.STRIDE)                          # the snippet's first output
        ks = np.arange(k_first, (self.first + len(self.rows)) // PS.STRIDE)
        # where each output's window ends, s from the snippet's start (as PhraseModel.outputs has it)
        e = ((self.origin - at) + (PS.STRIDE * ks + PS.STRIDE - 1) * PS.STEP + PS.WINDOW_SAMPLES) / PS.SAMPLE_RATE
        want = ks[(e >= keyword_end_s - PS.LO_S) & (e <= keyword_end_s + after_s)]   # windows' last outputs
        n = len(model.datas)
        if not len(want):
            return (0.0, [0.0] * n) if each else 0.0
        need_from, k1 = int(want[0]) - (PS.SLIDING - 1), int(want[-1]) + 1
        start = max(k_first, need_from - PS.WARMUP)
        first = self._outputs(model, 0, need_from, k1, start)
        # the windows whose last output is past the run's warm-up and still kept: one stretch of ``want``
        lo = max(int(want[0]), first.start + FIRST_LAST, first.base + PS.SLIDING - 1)
        hi = int(want[-1])
        if lo > hi:
            return (0.0, [0.0] * n) if each else 0.0
        ones = np.ones(PS.SLIDING) / PS.SLIDING

        def outs(run, a, b):   # outputs a .. b - 1 of a run, 0 before the first model's warm-up ended
            o = np.asarray(run.out[a - run.base:b - run.base], np.float32)
            o[:max(0, first.start + PS.WARMUP - a)] = 0.0
            return o

        a = lo - (PS.SLIDING - 1)                              # the first output the windows read
        each_out = [outs(first, a, hi + 1)]
        if n == 1 or each:
            bound = None
        sums, under = np.convolve(each_out[0], ones, mode="valid"), []
        for m in range(1, n):
            if bound is not None:
                # the models run so far: their window means; each model still to run adds at most 1, so
                # where (sum + models left) / n < bound the ensemble cannot reach it there
                top = (sums + (n - m)) / n
                need = np.flatnonzero(top >= bound - 1e-6)
                if not len(need):
                    return float(max([top.max()] + [u.max() for u in under]))
                i0, i1 = int(need[0]), int(need[-1])
                under += [u for u in (top[:i0], top[i1 + 1:]) if len(u)]
                a, hi = a + i0, a + i1 + PS.SLIDING - 1            # the windows i0 .. i1 of those so far
                each_out, sums = [o[i0:i1 + PS.SLIDING] for o in each_out], sums[i0:i1 + 1]
            floor = max(first.start, a - PS.WARMUP, -(-self.first // PS.STRIDE))   # frames kept from there
            each_out.append(outs(self._outputs(model, m, a, hi + 1, floor), a, hi + 1))
            sums = sums + np.convolve(each_out[-1], ones, mode="valid")
        best = float(np.convolve(PS.ensemble_mean(np.stack(each_out)), ones, mode="valid").max())
        if bound is not None and best < bound and under:   # and the windows not run: their bounds are under it
            best = max(best, max(float(u.max()) for u in under))
        if each:
            return best, [max(0.0, float(np.convolve(o, ones, mode="valid").max())) for o in each_out]
        return best
