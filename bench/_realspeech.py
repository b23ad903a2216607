"""Real human speech for benchmarks: ``host.data.realspeech`` (moved there so that the toolchain,
which imports no benchmark code, can choose on the development half too); every name re-exported."""

from host.data.realspeech import (  # noqa: F401
    NUMERALS, PACKAGE, SOUNDS, TRANSCRIPTS, Prompt, concat, is_speech, load_prompts, missing_reason, other_speakers,
    split, spoken_words, transcripts)
