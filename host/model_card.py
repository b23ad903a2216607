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


# What each supplement of the recipe (manifest extra.recipe, host/data/supplement.py) is, and its licence
ENGINES = {"rhvoice": "RHVoice's English voices bdl and clb (HTS voices of two real US speakers of CMU "
                      "ARCTIC; Debian non-free `rhvoice-english`, LGPL-2.1+)",
           "pico": "SVOX Pico's en-US and en-GB women (Debian non-free `libttspico-utils`: Apache-2.0 "
                   "code, lingware without source)"}
REAL = {"fr": "Asterisk's French prompts by June Wallack (`asterisk-core-sounds-fr-wav`, CC-BY-SA-3.0)",
        "it": "Asterisk's Italian prompts by Carlo Flora (`asterisk-core-sounds-it-wav`, CC-BY-3.0)",
        "ru": "Asterisk's Russian prompts (`asterisk-core-sounds-ru-wav`)",
        "es": "Asterisk's Mexican Spanish prompts by Allison Smith (`asterisk-core-sounds-es-wav`)"}


def _supplement(manifest: dict) -> str:
    rec = (manifest.get("extra") or {}).get("recipe") or {}
    engines = [(e, n) for e, n in rec.get("engines", []) if any(n)]
    langs, everyday = rec.get("real_negatives", []), rec.get("everyday", 0)
    if not engines and not langs and not everyday:
        return "Synthetic speech only.\n"
    parts = [f"{ENGINES.get(e, e)}: {n[0]} renders of each word and {n[1]} of each filler per voice"
             for e, n in engines]
    if langs:
        parts.append("real human speech as `_unknown_` only, cut into 1 s windows: "
                     + "; ".join(REAL.get(lg, str(lg)) for lg in langs))
    if everyday:
        parts.append(f"running speech of everyday words (`host/data/everyday_words.txt`, no command in them) as "
                     f"`_unknown_`, cut into 1 s windows: {everyday} phrases of 2-5 words per espeak-ng training "
                     f"voice, {3 * everyday} per Festival voice")
    return ("The training split also holds (`host/data/supplement.py`) " + "; ".join(parts)
            + ". No command is ever said by a real person in training.\n")


def _operating(manifest: dict) -> str:
    """The default operating point (manifest extra.operating) and what bench kws_base measured at it
    (bench/results/kws_base.json's rows of it; `edgelearn model --reuse` after the bench renews the card)."""
    import json
    from pathlib import Path

    op = (manifest.get("extra") or {}).get("operating")
    if not op:
        return ""
    thr = ", ".join(f"{w} {t:g}" for w, t in op["thresholds"].items())
    out = [f"## Default operating point\nEach command fires at its own threshold unless told otherwise: {thr} "
           f"({op.get('chosen_on', '')}).\n"]
    p = Path(__file__).resolve().parents[1] / "bench" / "results" / "kws_base.json"
    doc = json.loads(p.read_text()) if p.is_file() else None
    head = [r for r in doc or [] if r["name"].startswith("default operating point")]
    if head:
        out.append("Measured by bench `kws_base` at it (voices and speech never trained on):\n\n"
                   "| stream | metric | value |\n| --- | --- | --- |")
        for r in head:
            v = f"{100 * r['value']:.1f} %" if r["unit"] == "fraction" else f"{r['value']:g} {r['unit']}"
            out.append(f"| {r['name'].split(': ', 1)[1]} | {r['metric']} | {v} |")
        out.append("")
    return "\n".join(out) + "\n"


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
Made offline with Debian's synthesizers (`edgelearn data
synth`): espeak-ng ({accents} English accents x {variants} voice variants), Festival (kal, ked,
slt HTS) and Flite (awb, rms), each utterance with a random speaking rate and
pitch, placed at random in the 1 s window, mixed with white/pink/brown noise or
babble at random SNR. Splits are by voice (speaker-disjoint): {n.get(("train", "espeak"), 0)} espeak-ng
voices and {n.get(("train", "festival"), 0)} Festival voices train, {n.get(("val", "espeak"), 0)} espeak-ng voices validate,
{n.get(("test", "espeak"), 0)} espeak-ng voices and {n.get(("test", "festival"), 0)} Festival voice test, and Flite
({n.get(("unseen", "flite"), 0)} voices) is never trained on.
{_supplement(manifest)}
Training used {train_m.get('train_utterances', '?')} utterances with on-the-fly
speed/pitch perturbation, gain, spectral tilt, synthetic-room reverberation,
noise, time shift and SpecAugment ({train_m.get('epochs_run', '?')} epochs,
{train_m.get('train_minutes', '?')} min on 2 CPU cores).

{_operating(manifest)}
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
- Every command it learned was said by a synthesizer (real speech is only ever
  `_unknown_` here); on a real speaker it finds far fewer commands than on the
  synthetic test voices (the operating point above). Personalise on the device
  (few-shot enrolment, adaptation) or fine-tune on real recordings (`edgelearn
  data` loads a folder in the Speech Commands layout).
- English only; single word commands in a 1 s window.
- Synthetic noise and rooms; no music, TV or far-field microphone arrays.

Generated {date.today().isoformat()} by `edgelearn model`.
"""
