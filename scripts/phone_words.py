"""Write host/data/phone_words.txt: the vocabulary the verifier's phone model is trained on, and
host/data/everyday_words.txt: the next ``N_WORDS`` words of the same list, which no benchmark speaks.

The most frequent English words (PyPI ``wordfreq``, a development-time dependency only: the
list is committed), alphabetic, 2+ letters, less every word the ``kws_fewshot`` bench speaks
(its keywords, near misses, fillers, the 35 Speech Commands words, the stream's runs) and any
word that contains one of the bench's keywords or near misses or is contained in one (4+
letters): the bench then measures the verifier on words its phone model never heard.

The benchmarks' negative word pairs are drawn from phone_words.txt (``bench/_base_streams.
other_speech``, ``host/data/negatives.word_pairs``); a recipe that trains on everyday speech as
negatives (``scripts/train_variant.py --everyday``) draws from everyday_words.txt, so that no
benchmark scores it on words it was trained to refuse.

    $ pip install wordfreq && python scripts/phone_words.py     # phone_words.txt is rewritten as it is
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

N_WORDS = 8000


def main() -> None:
    from wordfreq import top_n_list

    from host.data.words import CUSTOM_PHRASES, FILLERS, NEAR_MISS, RUNS, SPEECH_COMMANDS

    spoken = list(FILLERS) + list(SPEECH_COMMANDS) + list(CUSTOM_PHRASES) + RUNS
    spoken += [w for ws in NEAR_MISS.values() for w in ws]
    banned = {w for t in spoken for w in t.lower().split()}
    keyish = {w for t in list(CUSTOM_PHRASES) + [w for ws in NEAR_MISS.values() for w in ws] for w in t.split()}

    def ok(w: str) -> bool:
        if not (w.isascii() and w.isalpha() and len(w) >= 2) or w in banned:
            return False
        return not any((k in w or w in k) and min(len(k), len(w)) >= 4 for k in keyish)

    ranked = [w for w in top_n_list("en", 50000) if ok(w)]
    data = Path(__file__).resolve().parents[1] / "host" / "data"
    for name, words in (("phone_words.txt", ranked[:N_WORDS]), ("everyday_words.txt", ranked[N_WORDS:2 * N_WORDS])):
        (data / name).write_text("\n".join(words) + "\n")
        print(f"wrote {len(words)} words to {data / name}")


if __name__ == "__main__":
    main()
