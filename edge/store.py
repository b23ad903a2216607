"""The device's bundle store: verified install, smoke check, atomic switch, rollback.

Layout under ``state_dir``::

    bundles/<model_id>-v<version>/   one verified bundle per directory
    bundles/.incoming-*/             an install in progress (removed at start-up)
    current                          JSON {"current": dir, "previous": dir|null}, replaced atomically
    .lock                            flock'd while the store changes (one writer at a time)

A power cut at any moment leaves ``current`` naming a complete, verified
bundle: the new bundle is copied and verified in a temp directory, smoke
checked, renamed into place, and only then does ``current`` change (temp file
+ fsync + os.replace). The previous bundle is kept for ``rollback()``.

    >>> store = BundleStore("/var/lib/edgelearn", trusted_keys="/etc/edgelearn/keys")
    >>> store.install("kws-v4.zip", smoke_check=lambda b: run_one_inference(b))
    >>> store.current().version
    4
    >>> store.rollback().version
    3
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from edge.atomic import atomic_write, fsync_dir  # noqa: F401  (the one implementation, re-exported for older callers)
from edge.errors import BundleError


def smoke_check_models(bundle, backend: str = "auto", placements=("cpu",)) -> None:
    """The default smoke check: load each runnable partition and run one inference on zeros.

    Raises if a model does not load, does not run, or returns NaN/inf, so a
    bundle that verifies but cannot run on this device is never switched to.
    """
    import numpy as np

    from edge.backends import backend_for, load

    ran = 0
    for part in bundle.partitions:
        if part["placement"] not in placements or part["format"] not in ("tflite", "onnx"):
            continue
        model = load(bundle.path(part["file"]), backend=backend_for(backend, part["format"]))
        zeros = [np.zeros([d if d > 0 else 1 for d in t.shape], t.dtype) for t in model.inputs]
        for out in model.run(*zeros):
            if not np.all(np.isfinite(out)):
                raise ValueError(f"partition {part['name']!r} returned NaN or inf on zero input")
        ran += 1
    if ran == 0:
        raise ValueError(f"no partition with placement {'/'.join(placements)} to run")


_MAX_POINTER_BYTES = 4096


def _is_bundle_dirname(name) -> bool:
    """None, or a plain directory name under bundles/ (what install writes: <model_id>-v<version>)."""
    return name is None or (isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name
                            and "\\" not in name and "\x00" not in name and not name.startswith("."))


def read_pointer(pointer_path) -> dict:
    """A store's ``current`` file, read without opening the store (nothing created, nothing swept):
    {"current": dirname|None, "previous": dirname|None}; a damaged file is a BundleError."""
    from edge.bundle import parse_manifest

    pointer_path = Path(pointer_path)
    if not pointer_path.exists():
        return {"current": None, "previous": None}
    try:
        with open(pointer_path, "rb") as f:
            raw = f.read(_MAX_POINTER_BYTES + 1)
        if len(raw) > _MAX_POINTER_BYTES:
            raise ValueError(f"larger than {_MAX_POINTER_BYTES} bytes")
        ptr = parse_manifest(raw, where=pointer_path.name)
        if not isinstance(ptr, dict) or "current" not in ptr:
            raise ValueError("no 'current' field")
        for key in ("current", "previous"):
            if not _is_bundle_dirname(ptr.get(key)):
                raise ValueError(f"{key} is {ptr.get(key)!r}, not a bundle directory name")
    except (ValueError, OSError, BundleError) as e:
        why = e.problem if isinstance(e, BundleError) else e
        raise BundleError(f"{pointer_path}: unreadable ({why})",
                          fix="delete it and install a bundle again") from None
    return {"current": ptr.get("current"), "previous": ptr.get("previous")}


class BundleStore:
    """Installed bundles of one device, with a current and a previous version."""

    def __init__(self, state_dir, trusted_keys=None):
        self.state_dir = Path(state_dir)
        self.bundles_dir = self.state_dir / "bundles"
        self.pointer_path = self.state_dir / "current"
        self.trusted_keys = trusted_keys
        self.bundles_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            self._sweep()

    @contextmanager
    def _locked(self):
        with open(self.state_dir / ".lock", "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _sweep(self) -> None:
        """Remove what an interrupted install left behind; never touches current or previous."""
        for p in self.bundles_dir.glob(".incoming-*"):
            shutil.rmtree(p, ignore_errors=True)

    def pointer(self) -> dict:
        """{"current": dirname|None, "previous": dirname|None}."""
        return read_pointer(self.pointer_path)

    def _load(self, dirname: str, trusted_keys=None, allow_unsigned: bool = False):
        from edge.bundle import load_bundle

        keys = trusted_keys if trusted_keys is not None else self.trusted_keys
        if keys is None and not allow_unsigned:
            raise BundleError("no trusted keys to verify the installed bundle with",
                              fix="pass trusted_keys= to BundleStore(...) or to this call")
        return load_bundle(self.bundles_dir / dirname, trusted_keys=keys, allow_unsigned=allow_unsigned)

    def current(self, trusted_keys=None, allow_unsigned: bool = False):
        """The current Bundle, re-verified on disk; None if nothing is installed."""
        name = self.pointer()["current"]
        return None if name is None else self._load(name, trusted_keys, allow_unsigned)

    def _copy_file(self, src: Path, dst: Path) -> None:
        # A plain chunked copy; kept as a method so a test can stop a process in the middle of it.
        with open(src, "rb") as fi, open(dst, "wb") as fo:
            shutil.copyfileobj(fi, fo, 1 << 20)
            fo.flush()
            os.fsync(fo.fileno())

    def _stage(self, src: Path, work: Path, keys, allow_unsigned):
        """Copy (or unzip) into work/b and verify the copy, which is what the device will run."""
        from edge.bundle import _DirSource, load_bundle

        dest = work / "b"
        if src.is_dir():
            for name in _DirSource(src).names():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                self._copy_file(src / name, dest / name)
            return load_bundle(dest, trusted_keys=keys, allow_unsigned=allow_unsigned)
        return load_bundle(src, trusted_keys=keys, allow_unsigned=allow_unsigned, extract_to=dest)

    def install(self, bundle_path, trusted_keys=None, smoke_check=None, *, allow_downgrade: bool = False,
                allow_model_change: bool = False, allow_unsigned: bool = False):
        """Verify, smoke-check and switch to a bundle; returns it. On any failure nothing changes."""
        from edge.bundle import Bundle

        src = Path(bundle_path)
        keys = trusted_keys if trusted_keys is not None else self.trusted_keys
        if keys is None and not allow_unsigned:
            raise BundleError("no trusted keys to verify the bundle with", fix="pass trusted_keys=")
        if not src.exists():
            raise BundleError(f"{src}: no such bundle", fix="give a bundle directory or .zip")
        with self._locked():
            ptr = self.pointer()
            work = Path(tempfile.mkdtemp(dir=self.bundles_dir, prefix=".incoming-"))
            try:
                new = self._stage(src, work, keys, allow_unsigned)
                self._check_order(ptr["current"], new, allow_downgrade, allow_model_change)
                if smoke_check is not None:
                    try:
                        smoke_check(new)
                    except Exception as e:
                        raise BundleError(f"{new.model_id} v{new.version}: smoke check failed ({type(e).__name__}: {e})",
                                          fix="the previous bundle stays current; fix the bundle or the device runtime") from None
                name = f"{new.model_id}-v{new.version}"
                final = self.bundles_dir / name
                if final.exists():  # a leftover of an install cut short after its rename
                    os.rename(final, work / "stale")
                os.rename(work / "b", final)
                fsync_dir(self.bundles_dir)
                previous = ptr["current"] if ptr["current"] != name else ptr["previous"]
                self._write_pointer(name, previous)
            except OSError as e:  # e.g. ENOSPC while copying: nothing switched, say so plainly
                raise BundleError(f"installing {src.name} failed: {e.strerror or e} ({e.filename or self.state_dir})",
                                  fix="free space or fix permissions in the state directory; "
                                      "the previous bundle stays current") from None
            finally:
                shutil.rmtree(work, ignore_errors=True)
            self._prune()
        return Bundle(final, new.manifest, src, new.key_id, new.authenticated_by)

    def _check_order(self, cur_name, new, allow_downgrade, allow_model_change) -> None:
        from edge.bundle import _DirSource, _read_small, parse_manifest, validate_manifest

        if cur_name is None:
            return
        try:  # read capped and parsed safely: the installed copy may have been damaged since
            cur = validate_manifest(parse_manifest(_read_small(_DirSource(self.bundles_dir / cur_name),
                                                               "manifest.json")))
        except (OSError, BundleError):
            return  # the current bundle is damaged; replacing it is the way out
        if cur.get("model_id") != new.model_id and not allow_model_change:
            raise BundleError(f"bundle is model {new.model_id!r}, the device runs {cur.get('model_id')!r}",
                              fix="pass allow_model_change=True to switch models")
        if cur.get("model_id") == new.model_id and new.version <= cur.get("version", -1) and not allow_downgrade:
            raise BundleError(f"{new.model_id} v{new.version} is not newer than the installed v{cur.get('version')}",
                              fix="build the bundle with a higher version, or pass allow_downgrade=True")

    def _write_pointer(self, current, previous) -> None:
        atomic_write(self.pointer_path, json.dumps({"current": current, "previous": previous}).encode() + b"\n")

    def _prune(self) -> None:
        ptr = self.pointer()
        keep = {ptr["current"], ptr["previous"]}
        for p in self.bundles_dir.iterdir():
            if p.is_dir() and not p.name.startswith(".") and p.name not in keep:
                shutil.rmtree(p, ignore_errors=True)

    def rollback(self, trusted_keys=None, allow_unsigned: bool = False):
        """Make the previous bundle current again (after verifying it); returns it."""
        with self._locked():
            ptr = self.pointer()
            if not ptr["previous"]:
                raise BundleError("no previous bundle to roll back to", fix="install an older bundle with allow_downgrade=True")
            bundle = self._load(ptr["previous"], trusted_keys, allow_unsigned)
            # The rolled-back-from version is dropped from the pointer so a later
            # rollback never bounces back onto the version that was just rejected.
            self._write_pointer(ptr["previous"], None)
            self._prune()
        return bundle
