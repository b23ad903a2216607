"""One error type for everything a user can fix.

``EdgelearnError`` carries a sentence that names what was wrong and what to do.
The CLI prints it on one line (no traceback) and exits with status 2.

    raise EdgelearnError("clip.wav is 44100 Hz", fix="resample it to 16000 Hz, e.g. `sox in.wav -r 16000 out.wav`")
"""


class EdgelearnError(Exception):
    """A problem with the user's input or environment, with the fix."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}; {fix}" if fix else problem)


def importable(module: str) -> bool:
    """Whether an optional package imports: what a command checks before any model loads, so that
    a missing extra is one sentence (``edge.confirm``, ``edge.phrase_stage``)."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


class BundleError(EdgelearnError):
    """A bundle is missing, tampered with, unsigned or for another model."""


class AudioError(EdgelearnError):
    """A WAV file has the wrong format, is truncated or is empty."""
