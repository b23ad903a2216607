"""A second stage for the base commands that hears other voices: phrase models for each command.

Why: the shipped encoder, trained on synthetic voices, peaks at 0.3-0.5 on voices it never heard,
while real speech reaches the same posteriors on words that start like a command. A second model
with another front end, another network and other training data confuses other words: the
ESPHome export's recipe (``host/export``: TFLite Micro's audio front end with its noise reduction
and PCAN, a streaming network with a 1 s receptive field, each command said by the corpus's 48
training voices and, since session 44, RHVoice's and Pico's four English voices, against word runs,
sentences, near misses and mined hard negatives), trained per command with no user clip, twice with
two seeds, whose per-inference outputs are averaged (the mean saturates less on real speech: on
development data, with the first stage at 0.2, it heard 63.3 / 48.3 / 31.1 % against one draw's
52.2 / 44.4 / 24.4 % at 0.3, both at 0 false accepts, session 43; with the four voices 66.1 / 56.7 /
42.2 %, session 44). The bundle ships the twenty models
(``phrase_<command>.tflite`` and ``phrase_<command>_1.tflite``, ~59 KB each; a bundle of session 42
names one file per command, which still loads) and ``extra.phrase_stage``: the first-stage
threshold the stage runs under, the snippet around a candidate, and each command's cutoff, all
chosen on development data only
(``host/phrase_stage.py``; docs/edge-runtime.md, "Phrase models as the base commands' second
stage"). Like ``edge.confirm.AsrConfirm`` it decides the Detector's base-keyword candidates
(``Detector(..., asr=PhraseConfirm(bundle))``): each candidate's audio, from ``before_s`` before its
keyword end to ``after_s`` after, goes through a fresh front end and the command's models (LiteRT,
one interpreter per model kept across snippets: ``PhraseModel``), and the event stands if the
highest sliding-window mean (ESPHome's window of 5 outputs) whose window ends from ``LO_S`` before
the keyword end to ``after_s`` after reaches the command's cutoff. Only on candidates: a few
seconds of audio a minute of speech. Unlike
PocketSphinx (``--asr``) it judges the command's sound, not the words: a word that starts with the
command ("yesterday", "stopwatch") passes it as the command itself does.

It is the default operating point's second stage wherever the bundle ships the models
(``edge.device_detect.default_stage``; since 2026-12-06, session 43). The front end is
``pymicro-features`` (the same C code ESPHome runs; a dependency on x86_64 and aarch64, as LiteRT
is), the models run under LiteRT (``ai-edge-litert``, the device runtime).

    >>> det = Detector(km, threshold=stage.first_stage, asr=PhraseConfirm(bundle))   # edge.detect
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgelearnError, importable

SAMPLE_RATE = 16000
STEP, WINDOW_SAMPLES, STRIDE = 160, 480, 3   # the front end's 10 ms step and 30 ms window; frames per inference
RECEPTIVE_S = 1.01                            # the network's receptive field (101 frames)
WARMUP = -(-(round(RECEPTIVE_S * SAMPLE_RATE / STEP) - STRIDE) // STRIDE)   # outputs reaching before the snippet (33)
SLIDING = 5                                   # ESPHome's sliding window of outputs
LO_S = 0.3                                    # a window may end this long before the keyword end
FEATURE_MAX = 26.0                            # host/export/frontend.py: features in [0, 26], int8 as ESPHome maps them
INPUT_SCALE, INPUT_ZERO = FEATURE_MAX / 255.0, -128


def available() -> bool:
    return importable("pymicro_features")


def require() -> None:
    """One sentence, before any model loads, where the front end is missing."""
    if not available():
        raise EdgelearnError("the phrase second stage needs pymicro-features (the TFLite Micro audio front end), "
                             "which is not installed", fix="pip install 'edgelearn[phrase]' (or run with --no-phrase)")


def has_models(bundle) -> bool:
    """Does the bundle ship phrase models (``extra.phrase_stage``)?"""
    cfg = (bundle.manifest.get("extra") or {}).get("phrase_stage")
    return isinstance(cfg, dict) and isinstance(cfg.get("models"), dict) and bool(cfg["models"])


def model_files(entry) -> list[str]:
    """``extra.phrase_stage.models``' entry of one command as a list: one file, or an ensemble's."""
    return [entry] if isinstance(entry, str) else list(entry)


def config(bundle) -> dict:
    """The bundle's ``extra.phrase_stage`` (checked), or one sentence where it has none."""
    if not has_models(bundle):
        raise EdgelearnError(f"bundle {bundle.model_id} v{bundle.version} has no phrase models",
                             fix="use the shipped bundle (or one `scripts/build_phrase_stage.py` added them to), "
                                 "or run with --no-phrase")
    return bundle.manifest["extra"]["phrase_stage"]


def features(pcm: np.ndarray) -> np.ndarray:
    """Front-end features of 16 kHz int16 audio from a fresh front end: (frames, 40) float32, one
    row per 10 ms after the first 30 ms (``host.export.frontend.features``, which trains on them)."""
    from pymicro_features import MicroFrontend

    data = np.ascontiguousarray(pcm, dtype="<i2").tobytes()
    fe, out, i, step = MicroFrontend(), [], 0, STEP * 2
    while i + step <= len(data):
        r = fe.process_samples(data[i:i + step])
        i += r.samples_read * 2
        if r.features:
            out.append(r.features)
        if r.samples_read == 0:
            break
    return np.asarray(out, np.float32).reshape(-1, 40)


def quantize(feats: np.ndarray) -> np.ndarray:
    """Features as the models' int8 input (ESPHome's mapping)."""
    return np.clip(np.round(feats / INPUT_SCALE) + INPUT_ZERO, -128, 127).astype(np.int8)


class PhraseModel:
    """One command's streaming model (int8 [1, 3, 40] in, uint8 [1, 1] out, state in resource
    variables), or an ensemble of such models, run over a snippet.

    Each model's interpreter is made once and kept (making two was a fourth of a judgment's CPU:
    bench ``phrase_judgment``, 3.42 -> 2.52 ms, the rest mostly the front end): the streaming state
    is a shift register of the last ``RECEPTIVE_S`` of frames, so every output whose window lies
    inside the snippet is what a fresh state gives, whatever ran
    before (checked output by output, ``tests/test_phrase_stage.py``). The first ``WARMUP`` outputs
    are not, so they are 0 (as ``host.export.esphome.stream_probabilities`` leaves them); the peak
    never reads them. LiteRT's ``reset_all_variables`` cannot stand in: it leaves resource
    variables as they are. A lock keeps two threads (two Wyoming clients) off one interpreter."""

    def __init__(self, data, name: str):
        import threading

        from edge.backends.litert import check_available

        check_available()
        from ai_edge_litert.interpreter import Interpreter

        # ``data``: one model's bytes, or several (an ensemble: draws of the same recipe with other
        # seeds, whose per-inference outputs are averaged before the sliding window)
        self.datas = [data] if isinstance(data, (bytes, bytearray)) else list(data)
        self.interpreter_cls, self.name = Interpreter, name
        self._lock, self._its, self._state = threading.Lock(), None, None

    def __getstate__(self):  # interpreters and locks do not pickle: a copy makes its own
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_its", "_state", "interpreter_cls")}

    def __setstate__(self, state):
        self.__init__(state["datas"], state["name"])

    def _interpreters(self) -> list:
        if self._its is None:
            its = []
            for data in self.datas:
                it = self.interpreter_cls(model_content=data, num_threads=1)
                it.allocate_tensors()
                its.append((it, it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]))
            self._its = its
        return self._its

    def _member(self, m: int, q: np.ndarray) -> np.ndarray:
        """Model ``m``'s output of each inference over int8 frames ``q`` (float32 in [0, 1])."""
        it, i_in, i_out = self._interpreters()[m]
        n = len(q) // STRIDE
        got = []
        for x in np.ascontiguousarray(q[:STRIDE * n]).reshape(n, 1, STRIDE, q.shape[-1]):
            it.set_tensor(i_in, x)
            it.invoke()
            got.append(it.get_tensor(i_out))
        # each output / 255 rounded to float32, as one by one before
        return (np.concatenate(got, axis=None) / 255.0).astype(np.float32) if got else np.zeros(0, np.float32)

    def _invoke(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each inference's output over int8 frames ``q``: (the mean over the models, each model's
        (models, n)), under the lock."""
        each = np.stack([self._member(m, q) for m in range(len(self.datas))])
        return ensemble_mean(each), each

    def outputs(self, feats: np.ndarray, each: bool = False):
        """(each inference's output in [0, 1], the mean over the ensemble's models, the first
        ``WARMUP`` 0; the time its window ends, s from the snippet's start); with ``each``, each
        model's outputs (models, n) as a third."""
        with self._lock:
            self._state = [None] * len(self.datas)   # a stream's run (``run``) cannot go on from here
            out, every = self._invoke(quantize(feats))
        out[:WARMUP] = 0.0
        every[:, :WARMUP] = 0.0
        ends = ((STRIDE * np.arange(len(out)) + STRIDE - 1) * STEP + WINDOW_SAMPLES) / SAMPLE_RATE
        return (out, ends, every) if each else (out, ends)

    def run(self, m: int, q: np.ndarray, before, after):
        """Model ``m``'s outputs (``_member``) over int8 frames ``q`` going on from the state the run
        named ``before`` left (None: from whatever state there is; the caller discards the first
        ``WARMUP`` outputs); None, running nothing, when something else ran the model since. The
        state left is named ``after`` (``edge.phrase_tape``: one stream's snippets share the models'
        work, each model on its own: those after the first run only where the mean could still
        reach the cutoff)."""
        with self._lock:
            if self._state is None:
                self._state = [None] * len(self.datas)
            if before is not None and self._state[m] != before:
                return None
            got = self._member(m, q)
            self._state[m] = after
            return got

    def peak(self, pcm: np.ndarray, keyword_end_s: float, after_s: float) -> float:
        """The highest sliding-window mean whose window ends within [keyword end - LO_S, keyword end
        + after_s] (s from the snippet's start) and past the network's warm-up; 0 where none does."""
        return self.peak_features(features(pcm), keyword_end_s, after_s)

    def peak_features(self, feats: np.ndarray, keyword_end_s: float, after_s: float) -> float:
        """``peak`` of a snippet's front-end frames (the first frame's window starting at its start)."""
        out, ends = self.outputs(feats)
        return window_peak(out, ends, keyword_end_s, after_s)

    def peaks(self, pcm: np.ndarray, keyword_end_s: float, after_s: float) -> tuple[float, list[float]]:
        """(``peak``, each model's own peak by the same rule)."""
        out, ends, every = self.outputs(features(pcm), each=True)
        return (window_peak(out, ends, keyword_end_s, after_s),
                [window_peak(o, ends, keyword_end_s, after_s) for o in every])


def ensemble_mean(each: np.ndarray) -> np.ndarray:
    """The ensemble's output per inference from its models' (models, n): added in float32 in order,
    then divided, as the device does."""
    out = np.zeros(each.shape[1], np.float32)
    for o in each:
        out += o
    out /= len(each)
    return out


def window_peak(out: np.ndarray, ends: np.ndarray, keyword_end_s: float, after_s: float) -> float:
    """``PhraseModel.peak``'s rule over outputs ``out`` whose windows end at ``ends``."""
    if len(out) < SLIDING:
        return 0.0
    mean = np.convolve(out, np.ones(SLIDING) / SLIDING, mode="valid")
    e = ends[SLIDING - 1:]
    ok = (e >= RECEPTIVE_S + (SLIDING - 1) * STRIDE * STEP / SAMPLE_RATE) & (e >= keyword_end_s - LO_S) \
        & (e <= keyword_end_s + after_s)
    return float(mean[ok].max()) if ok.any() else 0.0


def _padded(pcm, keyword_end_s: float | None, after_s: float):
    """(a candidate's snippet, padded with silence where the stream ended sooner, its keyword end)."""
    pcm = np.asarray(pcm, np.int16)
    end = len(pcm) / SAMPLE_RATE - after_s if keyword_end_s is None else float(keyword_end_s)
    short = int(round((end + after_s) * SAMPLE_RATE)) - len(pcm)
    if short > 0:  # the stream ended sooner: what follows is silence, as after a command said last
        pcm = np.concatenate([pcm, np.zeros(short, np.int16)])
    return pcm, end


def snippet_peak(model: PhraseModel, pcm, keyword_end_s: float | None, after_s: float) -> float:
    """``model``'s peak on a candidate's snippet whose keyword ends ``keyword_end_s`` into it (None:
    ``after_s`` before its end, a snippet cut as the Detector cuts it mid-stream)."""
    pcm, end = _padded(pcm, keyword_end_s, after_s)
    return model.peak(pcm, end, after_s)


def snippet_peaks(model: PhraseModel, pcm, keyword_end_s: float | None, after_s: float) -> tuple[float, list[float]]:
    """``snippet_peak`` and each of the ensemble's models' own peak (``PhraseModel.peaks``)."""
    pcm, end = _padded(pcm, keyword_end_s, after_s)
    return model.peaks(pcm, end, after_s)


class PhraseConfirm:
    """``says(word, pcm) -> bool`` for ``edge.detect.Detector``'s ``asr`` hook: does ``word``'s phrase
    model reach its cutoff on the candidate's snippet (int16, ``before_s`` + ``after_s`` s ending
    ``after_s`` after the keyword end)? A word without a phrase model passes. ``decoded`` and
    ``seconds`` count the snippets and their audio; ``last`` is the last peak."""

    def __init__(self, bundle):
        require()
        cfg = config(bundle)
        self.first_stage = float(cfg["first_stage"])
        self.before_s, self.after_s = float(cfg["before_s"]), float(cfg["after_s"])
        self.cutoffs = {w: float(c) for w, c in cfg["cutoffs"].items()}
        self.models = {w: PhraseModel([bundle.path(f).read_bytes() for f in model_files(f)], w)
                       for w, f in cfg["models"].items()}
        self.decoded, self.seconds, self.last = 0, 0.0, None

    def peak(self, word: str, pcm, keyword_end_s: float | None = None) -> float | None:
        """``word``'s model's peak on ``pcm`` (None: no model); ``keyword_end_s``: where the keyword
        ends in it (default: ``after_s`` before its end, a snippet cut as the Detector cuts it)."""
        model = self.models.get(word)
        if model is None:
            return None
        self.decoded += 1
        self.seconds += len(pcm) / SAMPLE_RATE
        self.last = snippet_peak(model, pcm, keyword_end_s, self.after_s)
        return self.last

    def says_at(self, word: str, pcm, keyword_end_s: float) -> bool:
        """``says`` for a snippet whose keyword ends ``keyword_end_s`` into it (the Detector passes it:
        a stream that ended less than ``after_s`` after the keyword gives a shorter snippet)."""
        p = self.peak(word, pcm, keyword_end_s)
        return p is None or p >= self.cutoffs.get(word, 1.0)

    def says(self, word: str, pcm) -> bool:
        return self.says_at(word, pcm, len(pcm) / SAMPLE_RATE - self.after_s)
