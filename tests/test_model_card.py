"""The model card states the corpus as it is: voice counts per split come from the split rule."""

from __future__ import annotations

from pathlib import Path

from host.data import synth
from host.data.corpus import CorpusConfig, assign_splits
from host.model_card import voice_counts

ROOT = Path(__file__).resolve().parents[1]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_voice_counts_follow_the_split_rule():
    cfg = CorpusConfig(espeak_test=3, espeak_val=2)
    n = voice_counts(cfg)
    esp = len(synth.ESPEAK_ACCENTS) * synth.VARIANTS_PER_ACCENT
    assert n[("test", "espeak")] == 3 and n[("val", "espeak")] == 2 and n[("train", "espeak")] == esp - 5
    assert n[("test", "festival")] == 1 and n[("train", "festival")] == len(synth.FESTIVAL_VOICES) - 1
    splits = assign_splits(synth.all_voices(), cfg)
    assert sum(n.values()) == len(splits)


def test_shipped_model_card_states_the_real_split():
    n = voice_counts()
    card = _flat((ROOT / "models/kws-dscnn-s/MODEL_CARD.md").read_text())
    assert (f"{n[('train', 'espeak')]} espeak-ng voices and {n[('train', 'festival')]} Festival voices train, "
            f"{n[('val', 'espeak')]} espeak-ng voices validate, {n[('test', 'espeak')]} espeak-ng voices and "
            f"{n[('test', 'festival')]} Festival voice test") in card
