"""Render MODEL_CARD.md for a bundle from the training and quantisation metrics.

    >>> text = render(manifest, train_metrics, quant_metrics, cross_synth_rows)
"""

from __future__ import annotations

from datetime import date


def _pct(v) -> str:
    return "—" if v is None else f"{100 * v:.1f} %"


def voice_counts(cfg=None) -> dict:
    """{(split, synth): voices} for a corpus config (the recipe's default), from its split rule."""
    from collections import Counter

    from host.data import synth
    from host.data.corpus import CorpusConfig, assign_splits

    cfg = cfg or CorpusConfig()
    voices = [v for v in synth.all_voices() if v.synth in cfg.synths]
    splits = assign_splits(voices, cfg)
    return dict(Counter((splits[v.id], v.synth) for v in voices))


def _phones(manifest: dict) -> list:
    return next((p.get("phones", []) for p in manifest["partitions"] if p.get("role") == "phones"), [])


def render(manifest: dict, train_m: dict, quant_m: dict, cross: list | None, corpus_cfg=None) -> str:
    from host.data import synth

    pm = manifest.get("extra", {}).get("metrics", {}).get("phones") or {}

    n = voice_counts(corpus_cfg)
    accents, variants = len(synth.ESPEAK_ACCENTS), synth.VARIANTS_PER_ACCENT
    q = quant_m
    rows = []
    for split, desc in (("val", "espeak-ng voices held out for validation"),
                        ("test", "held-out espeak-ng voices + one held-out Festival voice"),
                        ("unseen", "Flite awb + rms: a synthesizer never trained on")):
        rows.append(f"| {split} | {desc} | {_pct(q['fp32'].get(split))} | "
                    f"{_pct(q['int8_tflite'].get(split))} | {_pct(q['int8_onnx'].get(split))} |")
    per_synth = []
    for split in ("test", "unseen"):
        m = train_m.get(split, {})
        for k, v in sorted(m.items()):
            if k.startswith("acc12_"):
                per_synth.append(f"| {split} | {k[6:]} | {_pct(v)} | {_pct(m.get('bal12_' + k[6:]))} | "
                                 f"{_pct(m.get('cmd_' + k[6:]))} |")
    balanced = [f"| {split} | {_pct(train_m[split].get('acc12'))} | {_pct(train_m[split].get('bal12'))} | "
                f"{_pct(train_m[split].get('cmd'))} |" for split in ("val", "test", "unseen") if split in train_m]
    cross_rows = []
    for r in cross or []:
        if r.get("metric") == "acc12":
            cross_rows.append(f"| {r['name']} | {_pct(r['value'])} | {r['baseline']} | "
                              f"{_pct(r['baseline_value'])} |")
    b = q.get("bytes", {})
    return f"""# Model card: {manifest['model_id']} v{manifest['version']}

A DS-CNN-S keyword encoder ("Hello Edge" shape: one 10x4 stride-2 convolution,
four depthwise-separable blocks of 64 channels, average pooling to a 64-d
embedding, a 37-way classifier) for 1 s of 16 kHz audio, shipped as full-integer
int8 TFLite, int8 ONNX (QDQ) and an fp32 TFLite reference.

## Intended use
Spotting the 35 Speech Commands words (12-class task: yes, no, up, down, left,
right, on, off, stop, go, unknown, silence) on Raspberry Pi–class boards, and
providing the embedding from which devices enrol custom keywords few-shot.

## Data
Synthetic speech only, made offline with Debian's synthesizers (`edgelearn data
synth`): espeak-ng ({accents} English accents x {variants} voice variants), Festival (kal, ked,
slt HTS) and Flite (awb, rms), each utterance with a random speaking rate and
pitch, placed at random in the 1 s window, mixed with white/pink/brown noise or
babble at random SNR. Splits are by voice (speaker-disjoint): {n.get(("train", "espeak"), 0)} espeak-ng
voices and {n.get(("train", "festival"), 0)} Festival voices train, {n.get(("val", "espeak"), 0)} espeak-ng voices validate,
{n.get(("test", "espeak"), 0)} espeak-ng voices and {n.get(("test", "festival"), 0)} Festival voice test, and Flite
({n.get(("unseen", "flite"), 0)} voices) is never trained on.
Training used {train_m.get('train_utterances', '?')} utterances with on-the-fly
speed/pitch perturbation, gain, spectral tilt, synthetic-room reverberation,
noise, time shift and SpecAugment ({train_m.get('epochs_run', '?')} epochs,
{train_m.get('train_minutes', '?')} min on 2 CPU cores).

## Accuracy (12-class)
| split | voices | fp32 | int8 TFLite | int8 ONNX |
| --- | --- | --- | --- | --- |
{chr(10).join(rows)}

Each split keeps all 35 words, so about 80 % of its clips are `_unknown_` and
the accuracy above mostly measures rejecting other words. The Speech Commands
test protocol has about as many unknown and silence clips as clips of each
command; its figure is the class-balanced accuracy (mean recall over the 12
classes). Command recall is the share of the 10 commands' clips named right
(fp32):

| split | accuracy | class-balanced | command recall |
| --- | --- | --- | --- |
{chr(10).join(balanced) if balanced else '| (not measured: retrain with `edgelearn model`) | | | |'}

Per synthesizer (fp32):

| split | synthesizer | accuracy | class-balanced | command recall |
| --- | --- | --- | --- | --- |
{chr(10).join(per_synth)}

Few-shot separability of 20 phrases never trained on (nearest prototype from 5
clips, clips from held-out voices): {_pct(train_m.get('fewshot5_custom_phrases'))}.

Leave-one-synthesizer-out (`bench/cross_synth`):

| trained without | 12-class accuracy on it | reference | reference accuracy |
| --- | --- | --- | --- |
{chr(10).join(cross_rows) if cross_rows else '| (not measured yet: run `edgelearn bench cross_synth`) | | | |'}

For scale: answering `_unknown_` for every clip scores about 80 % on these sets
(25 of the 35 words and all fillers map to unknown), so a model trained on one
synthesizer alone is barely above that floor on the other — which is why the
corpus mixes synthesizers and the augmentation warps the vocal tract.

## Size and compute
{train_m.get('params', '?')} parameters (before batch-norm folding), {train_m.get('macs', 0) / 1e6:.2f} M MACs
per 1 s window. int8 TFLite {b.get('encoder_int8.tflite', 0)} bytes, int8 ONNX
{b.get('encoder_int8.onnx', 0)} bytes, fp32 TFLite {b.get('encoder_fp32.tflite', 0)} bytes.
Layers kept in float by the quantiser: TFLite {q['fallback'].get('tflite') or 'none'}, ONNX
{q['fallback'].get('onnx') or 'none'}.

## The custom-keyword verifier's phone model
`phones_int8.tflite` ({pm.get('bytes', '?')} bytes): per 20 ms frame, posteriors over
{len(_phones(manifest))} espeak-ng phones, trained with CTC on {pm.get('texts', '?')} words and word pairs none of
which the `kws_fewshot` bench speaks, from the training voices only (`host/phones.py`). Phone
error rate on held-out words, greedy decoding, noisy windows: {_pct(pm.get('per_heldout_words'))}. It runs
only when a custom keyword's first stage fires (docs/edge-runtime.md, verifier version 5).

## Known limits
- Commands are recognised far less often than the plain accuracy suggests:
  command recall on test is {_pct(train_m.get('test', {}).get('cmd'))}; most misses become `_unknown_` ("stop",
  "up", "off", "on"), and "go"/"down", "up"/"off" are confused
  (docs/frontend-and-model.md).
- Trained on synthetic voices only. Accuracy on human speech is not measured
  here and will be lower; personalise on the device (few-shot enrolment,
  adaptation) or fine-tune on real recordings (`edgelearn data` loads a folder
  in the Speech Commands layout).
- English only; single word commands in a 1 s window.
- Synthetic noise and rooms; no music, TV or far-field microphone arrays.

Generated {date.today().isoformat()} by `edgelearn model`.
"""
