"""Drive the keyword-spotting peers, which live in their own virtualenv (bench/peers/README.md).

Not a benchmark itself (hence the leading underscore). This side runs in edgelearn's venv and
imports nothing of any peer: it writes a JOB file, runs the peer's runner script with the peer
venv's python by subprocess, and reads back its OUT file.

    >>> out = run_pocketsphinx("long.wav", {"yes": 1e-20, "stop": 1e-20})
    >>> out["events"]       # [{"keyword": "yes", "time_s": 2.36, ...}, ...]
    >>> sweep = run_pocketsphinx("long.wav", ["yes", "stop"], thresholds=[1e-40, 1e-20, 1])["sweep"]

The peer venv is .venv-peers at the repository root (``bash bench/peers/setup.sh``, or
``make .venv-peers/bin/python``); EDGELEARN_PEERS_PYTHON names another python to use instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(__file__).resolve().parent / "peers"
POCKETSPHINX_RUNNER = PEERS / "pocketsphinx_kws.py"
WAKEWORD_RUNNER = PEERS / "wakeword_probs.py"
SETUP_HINT = "bash bench/peers/setup.sh"


def _env_var(name: str) -> str:
    return f"EDGELEARN_{name.upper().replace('-', '_')}_PYTHON"


def why_no_peer(name: str = "peers") -> str:
    """Why peer_python(name) is None, as one sentence with the fix; "" when the venv is there."""
    override = os.environ.get(_env_var(name))
    if override:
        return "" if Path(override).is_file() else f"{_env_var(name)}={override} is not a file."
    py = ROOT / f".venv-{name}" / "bin" / "python"
    if not py.exists():
        return f"the peer virtualenv {py.parent.parent.name}/ is not set up: run `{SETUP_HINT}`."
    if name == "peers" and not any((py.parent.parent / "lib").glob("python*/site-packages/pocketsphinx")):
        return f"{py.parent.parent.name}/ has no pocketsphinx: run `{SETUP_HINT}`."
    return ""


def peer_python(name: str = "peers") -> Path | None:
    """The python of the peer venv ``.venv-<name>`` (or $EDGELEARN_<NAME>_PYTHON) if set up, else
    None; why_no_peer(name) then says why and how to fix it."""
    if why_no_peer(name):
        return None
    override = os.environ.get(_env_var(name))
    return Path(override) if override else ROOT / f".venv-{name}" / "bin" / "python"


def _wav_seconds(path: Path) -> float:
    try:
        with wave.open(str(path), "rb") as w:
            return w.getnframes() / float(w.getframerate())
    except (wave.Error, EOFError) as e:
        raise ValueError(f"{path} is not a readable WAV file ({e})") from e


def _check_out(out: dict, sweep: bool) -> dict:
    need = ("sweep", "cpu_s", "audio_s", "version") if sweep else ("events", "cpu_s", "audio_s", "version")
    missing = [k for k in need if k not in out]
    if missing:
        raise RuntimeError(f"PocketSphinx peer OUT lacks {', '.join(missing)}: {sorted(out)}")
    for block in (out["sweep"] if sweep else [out]):
        for ev in block["events"]:
            if not isinstance(ev.get("keyword"), str) or not isinstance(ev.get("time_s"), (int, float)):
                raise RuntimeError(f"PocketSphinx peer OUT has a malformed event: {ev!r}")
    return out


def run_pocketsphinx(wav_path: str | os.PathLike, keyphrases, thresholds=None, timeout: float | None = None,
                     *, chunk_s: float | None = None, config: dict | None = None,
                     python: str | os.PathLike | None = None) -> dict:
    """PocketSphinx keyphrase spotting over a 16 kHz mono int16 WAV, run in the peer venv.

    keyphrases: {phrase: kws threshold} (a kws file line each: ``yes /1e-20/``); with
    ``thresholds`` (a sweep, one decode per threshold, every phrase at it) a plain list of phrases
    will do. Returns the runner's OUT: {"events": [{"keyword", "time_s", ...}], "cpu_s", "audio_s",
    "version", ...}, or with thresholds {"sweep": [{"threshold", "events", "cpu_s"}, ...], ...}.
    timeout (s) defaults to 120 s plus real time for every decode. config: extra Decoder parameters.
    """
    wav = Path(wav_path).resolve()
    if not wav.is_file():
        raise FileNotFoundError(f"no such WAV: {wav}")
    if not keyphrases:
        raise ValueError("no keyphrases to spot")
    if thresholds is None and not isinstance(keyphrases, dict):
        raise ValueError("keyphrases must map each phrase to its threshold, or give thresholds= for a sweep")
    if thresholds is not None and not list(thresholds):
        raise ValueError("thresholds= is empty")
    if python is None:
        py = peer_python("peers")
        if py is None:
            raise RuntimeError(f"PocketSphinx peer unavailable: {why_no_peer('peers')}")
    else:
        py = Path(python)
    job: dict = {"wav": str(wav),
                 "keyphrases": ({str(k): float(v) for k, v in keyphrases.items()} if isinstance(keyphrases, dict)
                                else [str(k) for k in keyphrases])}
    if thresholds is not None:
        job["thresholds"] = [float(t) for t in thresholds]
    if chunk_s is not None:
        job["chunk_s"] = float(chunk_s)
    if config:
        job["config"] = dict(config)
    if timeout is None:
        timeout = 120.0 + _wav_seconds(wav) * (len(job.get("thresholds", [])) or 1)
    return _check_out(_run_runner(py, POCKETSPHINX_RUNNER, job, timeout, "PocketSphinx", wav), thresholds is not None)


def _run_runner(py: Path, runner: Path, job: dict, timeout: float, label: str, what) -> dict:
    """Run ``runner`` JOB OUT with the peer venv's ``py``; returns OUT, or raises one sentence."""
    # The peer must not see edgelearn's packages: no PYTHONPATH/PYTHONHOME from this side.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    with tempfile.TemporaryDirectory(prefix=f"peer-{runner.stem}-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        try:
            proc = subprocess.run([str(py), str(runner), str(job_path), str(out_path)],
                                  cwd=tmp, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{label} peer ran past its {timeout:.0f} s timeout on {what}") from e
        except OSError as e:
            raise RuntimeError(f"{label} peer could not start ({py}: {e}); run `{SETUP_HINT}`.") from e
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"{label} peer failed (exit {proc.returncode}): " + " | ".join(tail))
        if not out_path.is_file():
            raise RuntimeError(f"{label} peer exited 0 but wrote no OUT file")
        try:
            return json.loads(out_path.read_text())
        except json.JSONDecodeError as e:
            raise RuntimeError(f"{label} peer wrote an unreadable OUT ({e})") from e


def run_wakeword_peers(wavs, systems, timeout: float | None = None) -> dict:
    """openWakeWord's and microWakeWord's released models (``"openwakeword:hey_jarvis"``,
    ``"microwakeword:okay_nabu"``, ...) over 16 kHz mono int16 WAVs, in the peer venv
    (bench/peers/wakeword_probs.py); returns its OUT: per system and WAV the probability trace
    {"t": [...], "p": [...]}, CPU seconds per package (its front end once, all its models), each
    system's default threshold."""
    wavs = [str(Path(w).resolve()) for w in wavs]
    missing = [w for w in wavs if not Path(w).is_file()]
    if missing or not wavs or not systems:
        raise ValueError(f"run_wakeword_peers needs WAVs and systems (missing: {missing[:3]})")
    py = peer_python("peers")
    if py is None or not any((py.parent.parent / "lib").glob("python*/site-packages/pymicro_wakeword")):
        raise RuntimeError(f"the wake-word peers are not installed in .venv-peers: run `{SETUP_HINT}`.")
    if timeout is None:
        timeout = 120.0 + sum(_wav_seconds(Path(w)) for w in wavs) * 0.5 * len(systems)
    out = _run_runner(py, WAKEWORD_RUNNER, {"wavs": wavs, "systems": list(systems)}, timeout,
                      "openWakeWord/microWakeWord", f"{len(wavs)} WAVs")
    lost = [s for s in systems if s not in out.get("runs", {})]
    if lost:
        raise RuntimeError(f"wake-word peer OUT lacks {lost}")
    return out


def peer_traces(wavs: dict, systems, cache: Path) -> dict:
    """``run_wakeword_peers`` over ``wavs`` ({name: path}), cached under ``cache`` by the audio's
    digest (the traces never change for the same audio and pinned packages); the trace keys are the
    names (bench/kws_custom.py)."""
    import hashlib

    h = hashlib.sha1(json.dumps(systems).encode())
    for name in sorted(wavs):
        h.update(name.encode() + Path(wavs[name]).read_bytes())
    path = Path(cache) / f"peers-{h.hexdigest()[:16]}.json"
    if path.is_file():  # their CPU figures are the run that filled the cache's (``measured``: its time)
        from datetime import datetime, timezone

        out = json.loads(path.read_text())
        out["measured"] = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return out
    out = run_wakeword_peers(list(wavs.values()), systems)
    by_path = {v: k for k, v in wavs.items()}
    out["runs"] = {s: {by_path[w]: tr for w, tr in r.items()} for s, r in out["runs"].items()}
    from edge.atomic import atomic_write

    atomic_write(path, json.dumps(out).encode())
    return out
