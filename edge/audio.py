"""WAV input and output for 16 kHz mono 16-bit PCM, with errors a user can act on.

One bounded reader serves every command: ``read_wav`` for a clip (at most
``max_samples`` in memory), ``open_wav(...).chunks(n)`` to stream a recording of
any length in n-sample pieces (``edgelearn device detect``).

    >>> from edge.audio import open_wav, read_wav, write_wav
    >>> pcm = read_wav("yes.wav")             # int16 ndarray, 16 kHz mono
    >>> with open_wav("long.wav") as w:       # any length, O(chunk) memory
    ...     for chunk in w.chunks(1600): ...
    >>> write_wav("copy.wav", pcm)           # atomic: temp file + rename
"""

from __future__ import annotations

import os
import stat
import struct
import wave
from pathlib import Path

import numpy as np

from edge.atomic import atomic_file
from edge.errors import AudioError

SAMPLE_RATE = 16000
_FIX_FORMAT = "convert it with `sox IN.wav -r 16000 -c 1 -b 16 OUT.wav`"


MAX_READ_BYTES = 1 << 16      # the most the reader asks the file for in one read
MAX_HEADER_BYTES = 1 << 16    # metadata chunks read (not seeked over) before the audio
MAX_FMT_BYTES = 1024
DEFAULT_MAX_SECONDS = 3600    # read_wav's cap on one clip held in memory (1 hour: 115 MB)
_UNKNOWN_LENGTH = 0x7FFFF000  # a data size this large from a pipe means "until the stream ends"
_PCM_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
_FIX_LONG = "cut it into shorter clips, e.g. `sox IN.wav OUT.wav trim 0 60`"


def _kind(mode: int) -> str | None:
    """What a file of ``mode`` is when it cannot be read as a WAV (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


class _NotRegular(OSError):
    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


def _open(path: Path):
    """Open a WAV path for reading (a function of its own so a test can watch the reads). A regular
    file or a pipe (`--wav <(sox …)`, `/dev/stdin`, a named pipe) is read; a socket or a device is
    ``_NotRegular``, refused before it is opened (a device may give input forever or never). A
    named pipe is opened as any Unix reader opens one: it waits for its writer (Ctrl-C stops it);
    opened without waiting, a reader that came first would see the end before the writer began."""
    mode = os.stat(path).st_mode
    if stat.S_ISFIFO(mode):
        return open(path, "rb")
    kind = _kind(mode)
    if kind is None:  # opened without blocking, and checked again: the path may have changed meanwhile
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            kind = _kind(os.fstat(fd).st_mode)
            if kind is None:
                if getattr(os, "O_NONBLOCK", 0):
                    os.set_blocking(fd, True)
                return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise _NotRegular(kind)


def _seconds(n: int) -> str:
    return f"{n / SAMPLE_RATE:.1f} s"


class WavReader:
    """A 16 kHz mono 16-bit PCM WAV opened for bounded, incremental reading.

    ``open_wav`` parses the header (at most ``MAX_HEADER_BYTES`` of metadata from a
    stream, any amount seeked over in a regular file) and checks the format; the audio
    is then read ``chunks(n)`` at a time (never more than ``MAX_READ_BYTES`` per read)
    or whole with ``read()``, which refuses more than ``max_samples``. A regular file
    is checked against its header up front (truncated, too short, too long); a pipe or
    device is checked as it is read.
    """

    def __init__(self, f, name: str, regular: bool, size: int | None, *, min_samples: int = 1,
                 max_samples: int | None = None, long_fix: str = _FIX_LONG):
        self.f, self.name, self.regular = f, name, regular
        self.min_samples, self.max_samples, self.long_fix = min_samples, max_samples, long_fix
        self.n_samples: int | None = None  # what the header promises; None: until the stream ends
        self.samples_read = 0
        self._parse(size)

    # -- header -----------------------------------------------------------------------------
    def _bad(self, problem: str, fix: str = _FIX_FORMAT):
        raise AudioError(f"{self.name}: {problem}", fix=fix)

    def _read(self, n: int) -> bytes:
        """Up to n bytes (short only at the end of the file), each read at most MAX_READ_BYTES."""
        parts, left = [], n
        while left > 0:
            try:
                b = self.f.read(min(left, MAX_READ_BYTES))
            except OSError as e:
                self._bad(f"cannot be read ({e.strerror or e})", fix="check the file or device")
            if not b:
                break
            parts.append(b)
            left -= len(b)
        return b"".join(parts)

    def _parse(self, size: int | None) -> None:
        head = self._read(12)
        if not head:
            self._bad("file is empty", fix="record or synthesise the clip again")
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            self._bad("not a WAV file (no RIFF/WAVE header)")
        pos, metadata, fmt = 12, 0, None
        while True:
            hdr = self._read(8)
            if len(hdr) < 8:
                self._bad("unreadable WAV (no data chunk)" if fmt else "unreadable WAV (no fmt chunk)")
            cid, csize = hdr[:4], struct.unpack("<I", hdr[4:])[0]
            pos += 8
            if cid == b"data":
                break
            padded = csize + (csize & 1)
            if cid == b"fmt ":
                if not 16 <= csize <= MAX_FMT_BYTES:
                    self._bad(f"unreadable WAV (fmt chunk of {csize} bytes)")
                body = self._read(padded)
                if len(body) < csize:
                    self._bad("unreadable WAV (file ends inside the fmt chunk)")
                fmt = body
            elif self.regular:
                if size is not None and pos + padded > size:
                    self._bad(f"unreadable WAV (a {cid!r} chunk runs past the end of the file)")
                self.f.seek(padded, 1)
            else:
                metadata += padded
                if metadata > MAX_HEADER_BYTES:
                    self._bad(f"unreadable WAV (more than {MAX_HEADER_BYTES} bytes of metadata before the audio)")
                if len(self._read(padded)) < padded:
                    self._bad("unreadable WAV (no data chunk)")
            pos += padded
        if fmt is None:
            self._bad("unreadable WAV (no fmt chunk before the data chunk)")
        tag, channels, rate, _, block, bits = struct.unpack("<HHIIHH", fmt[:16])
        if tag == 0xFFFE and len(fmt) >= 40 and fmt[26:40] == _PCM_GUID_TAIL:
            tag = struct.unpack("<H", fmt[24:26])[0]  # WAVE_FORMAT_EXTENSIBLE with a PCM sub-format
        if tag != 1:
            self._bad(f"encoding {tag:#06x} is not PCM")
        if bits != 16:
            self._bad(f"{bits}-bit samples, expected 16-bit PCM")
        if channels != 1:
            self._bad(f"{channels} channels, expected mono")
        if rate != SAMPLE_RATE:
            self._bad(f"sample rate {rate} Hz, expected 16000 Hz")
        if block != 2:
            self._bad(f"unreadable WAV (block align {block} for 16-bit mono)")
        if self.regular or csize < _UNKNOWN_LENGTH:
            self.n_samples = csize // 2
        if self.regular and size is not None:
            got = max(0, size - pos) // 2
            if got < self.n_samples:
                self._truncated(got)
        if self.n_samples is not None:
            self._check_length(self.n_samples, final=True)

    def _truncated(self, got: int):
        self._bad(f"truncated: header promises {self.n_samples} samples but only {got} are present",
                  fix="copy or record the file again")

    def _check_length(self, n: int, final: bool) -> None:
        if self.max_samples is not None and n > self.max_samples:
            most = self.max_samples / SAMPLE_RATE
            fix = self.long_fix if self.long_fix != _FIX_LONG else \
                f"cut it into clips of at most {most:g} s, e.g. `sox IN.wav OUT.wav trim 0 {most:g}`"
            self._bad(f"{_seconds(n)} long, longer than {most:g} s" if final else f"longer than {most:g} s",
                      fix=fix)
        if final and n == 0 and self.min_samples > 0:
            self._bad("holds no audio (0 samples)", fix="record or synthesise the clip again")
        if final and n < self.min_samples:
            self._bad(f"only {n} samples ({n / SAMPLE_RATE:.3f} s), need at least "
                      f"{self.min_samples} ({self.min_samples / SAMPLE_RATE:.3f} s)",
                      fix="use a longer clip" if n else "record or synthesise the clip again")

    # -- audio ------------------------------------------------------------------------------
    def _next(self, n: int) -> np.ndarray | None:
        """The next <= n samples, or None at the end of the audio (checked against the header)."""
        if self.n_samples is not None:
            n = min(n, self.n_samples - self.samples_read)
        raw = self._read(2 * n) if n > 0 else b""
        k = len(raw) // 2
        self.samples_read += k
        if k < n or n <= 0:  # the end: of the data chunk, or of the stream
            if self.n_samples is not None and self.samples_read < self.n_samples:
                self._truncated(self.samples_read)
            if k == 0:
                self._check_length(self.samples_read, final=True)
                return None
        if self.max_samples is not None and self.samples_read > self.max_samples:
            self._check_length(self.samples_read, final=False)
        return np.frombuffer(raw[: 2 * k], dtype="<i2").astype(np.int16)

    def chunks(self, n: int = 1600):
        """Yield the audio as int16 arrays of n samples (the last one shorter); memory stays O(n)."""
        if n < 1:
            raise ValueError("chunk size must be >= 1")
        while (c := self._next(n)) is not None:
            yield c

    def read(self) -> np.ndarray:
        """The whole clip (at most ``max_samples``, which read_wav always sets)."""
        want = self.n_samples if self.n_samples is not None else (self.max_samples or 0) + 1
        parts = []
        while (c := self._next(min(want, MAX_READ_BYTES // 2))) is not None:
            parts.append(c)
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)

    def close(self) -> None:
        if self._owned:
            self.f.close()

    _owned = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_wav(src, *, min_samples: int = 1, max_samples: int | None = None,
             long_fix: str = _FIX_LONG) -> WavReader:
    """Open a WAV (a path, or a binary file object read as a stream) for bounded reading.

    Every problem is one AudioError: missing, a directory, not RIFF/WAVE, not 16 kHz mono
    16-bit PCM, truncated, shorter than ``min_samples`` or longer than ``max_samples``.
    A path must be a regular file or a pipe (read as a stream, header first and bounded; a named
    pipe waits for its writer); a socket or a device (/dev/zero too) is refused unopened. A file
    object (stdin) is read as a stream too.
    """
    if hasattr(src, "read"):
        return WavReader(src, str(getattr(src, "name", "<stream>")), False, None, min_samples=min_samples,
                         max_samples=max_samples, long_fix=long_fix)
    path = Path(src)
    try:
        f = _open(path)
    except FileNotFoundError:
        raise AudioError(f"{path}: no such file", fix="check the path") from None
    except IsADirectoryError:
        raise AudioError(f"{path}: is a directory, not a WAV file") from None
    except _NotRegular as e:  # "not a WAV file" first: what the reader used to say after reading a device
        if e.kind == "a directory":
            raise AudioError(f"{path}: is a directory, not a WAV file") from None
        raise AudioError(f"{path}: not a WAV file but {e.kind}, not a regular file",
                         fix="give the path of a .wav file (save a stream to one first, or pipe raw 16 kHz mono "
                             "s16le PCM to `edgelearn device run --stdin`)") from None
    except PermissionError:
        raise AudioError(f"{path}: permission denied", fix="check the file's permissions") from None
    except OSError as e:
        raise AudioError(f"{path}: cannot be opened ({e.strerror or e})", fix="check the path") from None
    try:
        st = os.fstat(f.fileno())
        regular = stat.S_ISREG(st.st_mode)
        w = WavReader(f, str(path), regular, st.st_size if regular else None, min_samples=min_samples,
                      max_samples=max_samples, long_fix=long_fix)
    except BaseException:
        f.close()
        raise
    w._owned = True
    return w


def read_wav(path, *, min_samples: int = 1, max_samples: int | None = DEFAULT_MAX_SECONDS * SAMPLE_RATE,
             long_fix: str = _FIX_LONG) -> np.ndarray:
    """Read a 16 kHz mono 16-bit PCM WAV as int16; reject anything else clearly.

    Holds at most ``max_samples`` (default 1 hour) in memory: a longer file, or a
    stream that does not end, is one AudioError, never a MemoryError.
    """
    with open_wav(path, min_samples=min_samples, max_samples=max_samples, long_fix=long_fix) as w:
        return w.read()


def to_int16(samples) -> np.ndarray:
    a = np.asarray(samples)
    if a.dtype == np.int16:
        return a
    return np.clip(np.round(a * 32767.0), -32768, 32767).astype(np.int16)


def write_wav(path, samples, rate: int = SAMPLE_RATE) -> Path:
    """Write int16 (or float in [-1, 1]) mono PCM atomically."""
    path = Path(path)
    pcm = to_int16(samples)
    with atomic_file(path, mode=None) as f, wave.open(f, "wb") as w:  # audio is public: the umask's mode
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return path


# -- the microphone (``device detect --mic``, ``device run --mic``) -------------------------------------

class MicError(AudioError):
    """The microphone could not be opened, or stopped delivering audio (``arecord`` failed)."""


def mic_command(device: str | None = None) -> list[str]:
    """The ``arecord`` command that records 16 kHz mono s16le from ``device`` (None: ALSA's default)."""
    return ["arecord", "-q", *(["-D", device] if device else []), "-f", "S16_LE", "-r", str(SAMPLE_RATE),
            "-c", "1", "-t", "raw"]


def mic_chunks(n: int, device: str | None = None, other: str = "--wav FILE"):
    """int16 chunks of ``n`` samples from the microphone until it stops. A recorder that fails (no such
    card, the card busy or unplugged) is one ``MicError`` naming the command and its last stderr line,
    once the audio it did deliver is yielded; its stderr is passed on to ours as it comes. ``other``:
    the other audio sources of the command, for the fix."""
    import collections
    import shutil
    import subprocess
    import sys
    import threading

    if shutil.which("arecord") is None:
        raise MicError("--mic needs `arecord` (ALSA utils), which is not installed",
                       fix=f"apt install alsa-utils, or pass {other}")
    cmd = mic_command(device)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tail: collections.deque = collections.deque(maxlen=8)

    def drain():  # arecord's messages, kept (the last names the failure) and passed on
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            if line.strip():
                tail.append(line.strip())
            try:
                print(line, file=sys.stderr, flush=True)
            except (OSError, ValueError):
                pass

    reader = threading.Thread(target=drain, name="edgelearn-arecord-stderr", daemon=True)
    reader.start()
    heard = False
    try:
        while b := proc.stdout.read(2 * n):
            heard = True
            yield np.frombuffer(b[: len(b) // 2 * 2], "<i2")
        rc = proc.wait()
    finally:
        if proc.poll() is None:  # closed early (the caller stopped): not a failure
            proc.terminate()
            proc.wait()
        reader.join(timeout=5)
    if rc != 0:
        how = f"exited with status {rc}" if rc > 0 else f"was killed by signal {-rc}"
        said = f": {tail[-1]}" if tail else " without a message"
        what = "stopped" if heard else "could not be opened"
        raise MicError(f"the microphone {what}: `{' '.join(cmd)}` {how}{said}",
                       fix="check that `arecord -l` lists the capture card (plugged in, not in use by another "
                           "program) and pick it with --mic-device hw:CARD,DEV (or set ALSA's default device), "
                           f"or pass {other}")
