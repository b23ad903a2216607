"""Enrolling every keyword again when ``keywords.json`` is damaged, from what the device kept.

``Device.enroll`` keeps each keyword's clips, ``ST/enrolment/<slug>.npz`` (``edge.device_enrolment._slug``):
``clip_<i>`` (int16), ``speakers`` (one id per clip) and, since 2026-12-06, ``name``, ``sensitivity``,
``wav_names`` (the clip names its report used), ``negatives`` (the prototypes of the other keywords
it was trained against, in order) and ``enrolled_ns``, so that enrolling it again gives the same
entry (``read_kept``). ``ST/enrolment/settings.json`` (``write_settings``, at every save of the
keywords) keeps what only ``keywords.json`` held: each keyword's sensitivity and measured
false-accept rates, in order, and the other-voices path of a keyword taught them (``edgelearn
export voices``: its ``voices`` field and voices head).

``DeviceState.open`` (edge/keywords.py) calls ``rebuilt`` when the file's bytes are not JSON: under
the state lock the damaged bytes are kept as ``keywords.json.damaged``, every keyword is enrolled
again from its kept clips (``rebuild_keywords``: ``edge.enroll.enroll`` on the same clips), the
file is written atomically and one warning line names what was rebuilt, lost and needs setting
again. Nothing is rebuilt without kept clips, or when the state runs another model version
(``_bound_elsewhere``). Split from keywords.py and device_enrolment.py to keep each about one thing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from edge.atomic import atomic_write, state_lock
from edge.device_enrolment import ENROLMENT_DIR, SETTINGS_FILE, _slug
from edge.errors import EdgelearnError
from edge.keywords import DamagedKeywords, DeviceState, StateError, _read

_MODEL_IN = re.compile(rb'"model_id":\s*"([^"\\]{1,200})",\s*"model_version":\s*(\d{1,9})\D')
_NAME_IN = re.compile(rb'"name":\s*"([a-z0-9][a-z0-9 _\'-]{0,31})"')


def _bound_elsewhere(root: Path, bundle, raw: bytes | None) -> str | None:
    """Where the state says it runs another model version than ``bundle`` (what is left of the
    damaged file, the adapt pointer, the federated version the agent runs here), or None: the
    keywords are rebuilt only for the version the state runs (a command probing another version,
    the agent's check of a newly installed one, must not bind them to it)."""
    want = (bundle.model_id, bundle.version)
    m = _MODEL_IN.search(raw or b"")
    if m is not None and (m[1].decode("utf-8", "replace"), int(m[2])) != want:
        return f"{m[1].decode('utf-8', 'replace')} v{int(m[2])} (what is left of keywords.json says so)"
    try:
        model = json.loads((root / "adapt" / "active.json").read_bytes()).get("model")
    except (OSError, ValueError, AttributeError):
        model = None
    if isinstance(model, list) and len(model) == 2 and tuple(model) != want:
        return f"{model[0]} v{model[1]} (adapt/active.json says so)"
    from edge.device_models import fl_store_dir, installed_name

    store = fl_store_dir(root)
    mine = f"{bundle.model_id}-v{bundle.version}"
    if (store / "current").is_file() and (store / "bundles" / mine).is_dir():
        try:
            runs = installed_name(root)
        except EdgelearnError:
            runs = None
        if runs != mine:
            return f"{runs or 'the shipped model'} (the federated version the agent runs here)"
    return None


def rebuilt(root: Path, bundle, err: DamagedKeywords, backend: str = "auto") -> tuple:
    """(model_id, version, keywords) of a state whose keywords.json is damaged (``err``): its bytes kept
    as keywords.json.damaged and the keywords enrolled again from their kept clips
    (``rebuild_keywords``), written atomically, with one warning line on stderr;
    all of it under the state lock, so a second command waits and reads the rebuilt file. ``err``
    itself, as before, when the device kept no clips or the state runs another model version."""
    import sys

    from edge import atomic

    path = root / "keywords.json"
    if not kept_files(root):
        raise err  # nothing to rebuild from: the user decides (a backup, or enrolling again)
    with state_lock(root):
        try:
            return _read(path, bundle)  # rebuilt (or replaced) by another command meanwhile
        except DamagedKeywords as e:
            err = e
        try:
            raw = path.read_bytes()
        except OSError:
            raw = None  # the disk will not read it: the file itself is moved aside
        elsewhere = _bound_elsewhere(root, bundle, raw)
        if elsewhere is not None:
            raise StateError(f"{err.problem}, and this state runs {elsewhere}, not {bundle.model_id} "
                             f"v{bundle.version}", fix="run the command with that version's bundle (the "
                             "keywords are then enrolled again from their kept clips), or restore the file")
        names = [m.decode() for m in _NAME_IN.findall(raw or b"")]
        entries, rep = rebuild_keywords(root, bundle, known=list(dict.fromkeys(names)), backend=backend)
        damaged = path.with_name(path.name + ".damaged")
        try:
            if raw is not None:
                atomic_write(damaged, raw)  # a copy: a kill before the rebuilt file is in place rebuilds again
            else:
                atomic.replace(path, damaged)
            DeviceState(root, bundle.model_id, bundle.version, entries, bundle)._write()
        except OSError as e:
            raise StateError(f"{err.problem}; it could not be rebuilt from the kept clips ({e.strerror or e})",
                             fix=err.fix) from None
    print(json.dumps({"warning": _rebuild_warning(path, err.detail, rep)}), file=sys.stderr, flush=True)
    return bundle.model_id, bundle.version, entries


def _rebuild_warning(path: Path, detail: str, rep: dict) -> str:
    """One line: what was damaged, where it is kept, what was rebuilt, lost, and needs setting again."""
    n = len(rep["rebuilt"])
    msg = (f"{path} was damaged ({detail[:200]}; kept as {path.name}.damaged); rebuilt {n} "
           f"keyword{'' if n == 1 else 's'} from their enrolment clips"
           + (f" ({', '.join(rep['rebuilt'])})" if n else ""))
    if rep["lost"]:
        msg += "; lost (enrol again): " + "; ".join(f"{name} ({why})" for name, why in rep["lost"].items())
    if rep["as_enrolled"]:
        levels = ", ".join(f"{name} {level}" for name, level in rep["as_enrolled"].items())
        msg += (f"; no settings were kept, so the sensitivity is the enrolment's ({levels}) and no measured "
                "false-accept rates are known (set them again with `device sensitivity` and `device calibrate` "
                "if they had been changed)")
    if rep["recalibrate"]:
        msg += f"; {', '.join(rep['recalibrate'])}: measured false-accept rates lost (run `device calibrate` again)"
    if rep.get("voices_lost"):
        msg += "; other voices lost (run `edgelearn export voices` again): " + "; ".join(
            f"{name} ({why})" for name, why in rep["voices_lost"].items())
    return msg


def _text(z, key):
    """A one-string member of a kept clips file (None: absent, or not one string)."""
    if key not in z.files:
        return None
    v = z[key]
    return str(v[()]) if v.dtype.kind == "U" and v.ndim == 0 else None


def read_kept(path) -> dict | None:
    """A kept clips file (``Device.enroll``): {"clips": [int16], "speakers": [id per clip], "name",
    "sensitivity", "clip_names" (member ``wav_names``), "negatives" ((k, dim) float32), "enrolled_ns"},
    the fields a file of before 2026-12-06 lacks None; None when it cannot be read (missing, truncated,
    garbage, clips and speakers that do not match)."""
    import zipfile
    import zlib

    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as z:
            keys = sorted((k for k in z.files if k.startswith("clip_") and k[5:].isdigit()), key=lambda k: int(k[5:]))
            clips = [np.asarray(z[k], np.int16) for k in keys]
            who = np.asarray(z["speakers"], np.int64) if "speakers" in z.files else np.zeros(len(clips), np.int64)
            out = {"name": _text(z, "name"), "sensitivity": _text(z, "sensitivity"), "clip_names": None,
                   "negatives": None, "enrolled_ns": None}
            if "wav_names" in z.files:  # (not clip_*: a runtime of before 2026-12-06 reads those as clips)
                cn = z["wav_names"]
                out["clip_names"] = [str(n) for n in cn] if cn.dtype.kind == "U" and cn.shape == (len(clips),) else None
            if "negatives" in z.files:
                neg = np.asarray(z["negatives"])
                if neg.dtype.kind == "f" and neg.ndim == 2 and np.isfinite(neg).all():
                    out["negatives"] = neg.astype(np.float32)
            if "enrolled_ns" in z.files and z["enrolled_ns"].dtype.kind == "i" and z["enrolled_ns"].ndim == 0:
                out["enrolled_ns"] = int(z["enrolled_ns"])
    except (OSError, ValueError, KeyError, IndexError, EOFError, TypeError, zipfile.BadZipFile, zlib.error):
        return None  # (a truncated file keeps the zip's magic: BadZipFile; a torn member: ValueError or EOFError)
    if not clips or who.ndim != 1 or len(who) != len(clips) or any(c.ndim != 1 for c in clips):
        return None
    return {**out, "clips": clips, "speakers": [int(v) for v in who]}


def kept_files(state_dir) -> list[Path]:
    """The kept clips files of a state directory (none: an empty list)."""
    d = Path(state_dir) / ENROLMENT_DIR
    return sorted(p for p in d.glob("*.npz") if p.is_file()) if d.is_dir() else []


def enrolment_digest(entry: dict) -> str:
    """A digest of what one enrolment learned (heads, prototype, second stage): equal for the same
    enrolment, whatever its sensitivity or measured rates."""
    import hashlib

    fields = {k: entry.get(k) for k in ("w", "b", "prototype", "verify", "speaker_heads")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def write_settings(state_dir, keywords: list[dict]) -> None:
    """``ST/enrolment/settings.json``: per keyword, in order, what only ``keywords.json`` holds (its
    sensitivity, the false-accept rates ``device calibrate`` measured) and the digest of the
    enrolment they belong to. Written by ``DeviceState.save`` under the state lock, when the state
    keeps clips; read only by ``rebuild_keywords``. A copy, written after the file: one that cannot
    be written (a full disk) is removed rather than left stale, and the command that saved the
    keywords still succeeds (a rebuild then says the settings were not kept)."""
    d = Path(state_dir) / ENROLMENT_DIR
    if not d.is_dir():
        return
    doc = {"format": 1, "keywords": [
        {"name": k["name"], "enrolment": enrolment_digest(k), "sensitivity": k.get("sensitivity", "medium"),
         **{f: k[f] for f in ("fa_per_hour", "fa_calibrated_hours") if f in k}, **_voices_of(k)} for k in keywords]}
    try:
        atomic_write(d / SETTINGS_FILE, json.dumps(doc, indent=1).encode())
    except OSError:
        try:
            (d / SETTINGS_FILE).unlink(missing_ok=True)
        except OSError:
            pass


def _voices_of(entry: dict) -> dict:
    """What a rebuild needs to keep a keyword's other-voices path (``edge.custom_voices``): the
    ``voices`` field and the voices head's weights (its thresholds are recomputed)."""
    from edge.custom_voices import voices_head_of

    head = voices_head_of(entry)
    if "voices" not in entry or head is None:
        return {}
    return {"voices": entry["voices"], "voices_head": {"w": head["w"], "b": head["b"]}}


def read_settings(state_dir) -> list[dict] | None:
    """The entries of ``settings.json`` (``write_settings``), or None (none kept, or damaged)."""
    try:
        doc = json.loads((Path(state_dir) / ENROLMENT_DIR / SETTINGS_FILE).read_bytes())
        kws = doc["keywords"]
        if not (isinstance(kws, list) and all(isinstance(k, dict) and isinstance(k.get("name"), str) for k in kws)):
            return None
        return kws
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _name_of_file(path: Path, candidates=()) -> str | None:
    """The keyword name a kept clips file of before 2026-12-06 (no ``name`` member) was written for: one
    of ``candidates`` whose ``_slug`` is the file's, else found from the slug (its letters and digits,
    the separators between them tried, the name's digest checked); None if none matches."""
    import hashlib
    import itertools

    from edge.keywords import _NAME

    stem = path.stem
    for c in candidates:
        if _slug(c) == stem:
            return c
    m = re.fullmatch(r"([a-z0-9_]{1,32})-([0-9a-f]{8})", stem)
    if m is None:
        return None
    tokens, digest = m[1].split("_"), m[2]
    if "" in tokens or len(tokens) > 9:
        return None
    one, tails = (" ", "_", "-", "'"), ("", "_", "-", "'")
    seps = [one] + ([one + tuple(a + b for a in one for b in one if a + b != "  ")] if len(tokens) <= 4 else [])
    for sep in seps:
        for joins in itertools.product(sep, repeat=len(tokens) - 1):
            body = tokens[0] + "".join(j + t for j, t in zip(joins, tokens[1:]))
            for tail in tails:
                name = body + tail
                if hashlib.sha1(name.encode()).hexdigest()[:8] == digest and _NAME.match(name):
                    return name
    return None


def rebuild_keywords(state_dir, bundle, known=(), backend: str = "auto") -> tuple[list[dict], dict]:
    """Every keyword of ``state_dir`` whose clips the device kept, enrolled again on ``bundle`` from
    them exactly as ``Device.enroll`` enrolled it (``edge.enroll.enroll``, the same clips, clip names,
    speakers and the other keywords' prototypes it was trained against; a file of before 2026-12-06
    against the keywords rebuilt before it), for ``keywords.json`` when it is damaged
    (``DeviceState.open``). Each one's sensitivity and measured rates come from ``settings.json``
    (the rates only when the enrolment came out the same), else its enrolment's level. ``known``:
    names the damaged file still shows (for files without a name, and to name keywords with no kept
    clips). Nothing is written.

    Returns (entries in the keywords' order, report): ``rebuilt`` (names), ``lost`` ({name or file:
    why}), ``as_enrolled`` ({name: level} with no kept settings: the enrolment's level, medium for a
    file of before 2026-12-06; a later ``device sensitivity`` or ``device calibrate`` is not known),
    ``recalibrate`` (names whose measured rates are gone: the enrolment came out otherwise),
    ``voices_lost`` ({name: why} of keywords taught other voices whose path could not be kept; the
    others keep it, ``edge.custom_voices.carried``)."""
    from edge.enroll import SENSITIVITIES, check_keywords, enroll
    from edge.kws import KeywordModel

    settings = read_settings(state_dir)
    by_name = {s["name"]: s for s in settings or []}
    hints = list(by_name) + [n for n in known if n not in by_name]
    lost, recs = {}, []
    for p in kept_files(state_dir):
        rec = read_kept(p)
        name = (rec or {}).get("name") or _name_of_file(p, hints)
        if rec is None or name is None or _slug(name) != p.stem:  # (a name that is not the file's: damaged)
            lost[name or p.name] = f"its kept clips {p} are damaged" if rec is None or name else \
                f"the name its kept clips {p} were enrolled under could not be found"
            continue
        try:
            order = (rec["enrolled_ns"] or p.stat().st_mtime_ns, p.name)
        except OSError:
            order = (0, p.name)
        recs.append({**rec, "name": name, "order": order})
    place = {n: i for i, n in enumerate(by_name)}
    recs.sort(key=lambda r: (place.get(r["name"], len(place)), r["order"]))
    for n in hints:
        if n not in lost and all(r["name"] != n for r in recs):
            lost[n] = "the device kept no clips of it (enrolled before it kept them)"
    report = {"rebuilt": [], "lost": lost, "as_enrolled": {}, "recalibrate": [], "voices_lost": {}}
    if not recs:
        return [], report
    km = KeywordModel(bundle, backend=backend)
    done = []
    for r in recs:
        name, s = r["name"], by_name.get(r["name"])
        level = (s or {}).get("sensitivity") or r["sensitivity"]
        level = level if isinstance(level, str) and level in SENSITIVITIES else "medium"
        if r["negatives"] is not None:  # the other keywords' prototypes as its enrolment saw them
            others = [{"name": f"#{i}", "prototype": [float(v) for v in row]} for i, row in enumerate(r["negatives"])]
        else:
            others = list(done)
        scratch = DeviceState(Path(state_dir), bundle.model_id, bundle.version, others, bundle)
        try:
            enroll(km, scratch, name, r["clips"], clip_names=r["clip_names"], sensitivity=level,
                   speakers=r["speakers"], save=False)
        except EdgelearnError as e:
            lost[name] = f"it could not be enrolled again ({e.problem})"
            continue
        entry = scratch.keywords[-1]
        if s is not None and "voices" in s:  # taught other voices: the same head and models (edge.custom_voices)
            from edge.custom_voices import carried
            from edge.enroll import negative_bank

            head = s.get("voices_head")
            old = {"name": name, "voices": s["voices"],
                   "speaker_heads": [{**head, "voices": True}] if isinstance(head, dict) else []}
            entry, why = carried(old, entry, negative_bank(bundle), state_dir)
            if why is not None:
                report["voices_lost"][name] = why
        if s is None:
            report["as_enrolled"][name] = level
        elif any(f in s for f in ("fa_per_hour", "fa_calibrated_hours")):
            measured = {f: s[f] for f in ("fa_per_hour", "fa_calibrated_hours") if f in s}
            try:
                if s.get("enrolment") != enrolment_digest(entry):
                    raise ValueError("measured on another enrolment")
                check_keywords([{**entry, **measured}])
                entry.update(measured)
            except ValueError:
                report["recalibrate"].append(name)
        done.append(entry)
        report["rebuilt"].append(name)
    return done, report
