"""The systemd unit of ``edgelearn device run --print-unit``: the same agent the user tested.

Every option of the run is carried onto the unit's ``ExecStart`` (paths made absolute, every value
quoted with ``shlex``) except the audio source: the unit reads the microphone (``--mic``, with
``--mic-device`` when one was given). ``shlex.split`` of the ExecStart line, parsed by ``device
run``'s own parser, gives back the options of the command (tests/test_agent_unit_reload.py). The
unit runs in the directory it was printed in (``WorkingDirectory=``): an ``--on-detect`` command is
a shell line whose relative paths (``./hook.sh``) cannot be made absolute, and systemd would
otherwise run it in ``/``. ``%`` is doubled: systemd reads ``%s``, ``%h``... as its specifiers.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from edge.kws import named_bundle

UNIT = """[Unit]
Description=edgelearn device agent (keyword detection, on-device adaptation, federated rounds)
After=network-online.target sound.target
Wants=network-online.target

[Service]
WorkingDirectory={cwd}
ExecStart={exe} device run --state {state} --mic{extra}
Restart=on-failure
RestartSec=5
Nice=0
# logs go to the journal: `journalctl -u edgelearn-agent`
StandardOutput=journal
StandardError=journal

[Install]
WantedBy=multi-user.target
"""


def _path(p) -> str:
    return str(Path(p).expanduser().resolve())


def _num(v) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


def unit_options(cfg, *, bundle=None, trusted_keys=None, backend: str = "auto", sysfs_root=None) -> list[str]:
    """The options of ``device run`` that reproduce ``cfg`` (an ``AgentConfig``) on the microphone:
    those whose value differs from the parser's default, in the parser's order."""
    from edge.agent import AgentConfig

    d = AgentConfig()
    out: list[str] = []

    def opt(flag, value):
        out.extend([flag, value])

    if bundle is not None:
        opt("--bundle", _path(named_bundle(bundle)))  # a shipped bundle's name: its installed path
    if trusted_keys is not None:  # one path, or several (--pubkey is repeatable)
        for k in [trusted_keys] if isinstance(trusted_keys, (str, Path)) else list(trusted_keys):
            if not isinstance(k, (str, Path)):
                from edge.errors import EdgelearnError

                raise EdgelearnError("a unit can carry only trusted key files or directories",
                                     fix="pass --pubkey PATH (a file or a directory of keys), once per path")
            opt("--pubkey", _path(k))
    if backend and backend != "auto":
        opt("--backend", str(backend))
    if cfg.mic_device:
        opt("--mic-device", str(cfg.mic_device))
    if cfg.threshold is not None:
        opt("--threshold", _num(cfg.threshold))
    if cfg.sensitivity is not None:
        opt("--sensitivity", _num(cfg.sensitivity))
    if cfg.keywords is not None:
        opt("--keywords", cfg.keywords if isinstance(cfg.keywords, str) else ",".join(cfg.keywords))
    if cfg.confirm != d.confirm:
        opt("--confirm", _num(cfg.confirm))
    if cfg.asr == "phrase":
        out.append("--phrase")
    elif cfg.asr is False or cfg.asr is None:
        out.append("--no-phrase")
    elif cfg.asr != "auto":
        out.append("--asr")
    if cfg.on_detect is not None:
        opt("--on-detect", cfg.on_detect)
    if cfg.data is not None:
        opt("--data", _path(cfg.data))
    if cfg.strategy != d.strategy:
        opt("--strategy", str(cfg.strategy))
    if cfg.keep_versions is not None:
        opt("--keep-versions", str(cfg.keep_versions))
    if not cfg.adapt:
        out.append("--no-adapt")
    if cfg.adapt_every_s != d.adapt_every_s:
        opt("--adapt-every", _num(cfg.adapt_every_s))
    if cfg.aggregator is not None:
        opt("--aggregator", str(cfg.aggregator))
    if cfg.device_id is not None:
        opt("--device-id", str(cfg.device_id))
    if cfg.device_key is not None:
        opt("--device-key", _path(cfg.device_key))
    if cfg.checkin_every_s != d.checkin_every_s:
        opt("--checkin-every", _num(cfg.checkin_every_s))
    if cfg.network != d.network:
        opt("--network", str(cfg.network))
    if cfg.wyoming is not None:
        opt("--wyoming", str(cfg.wyoming))
    if cfg.zeroconf:
        out.append("--zeroconf")
        if cfg.zeroconf is not True:
            out.append(str(cfg.zeroconf))
    if sysfs_root is not None and Path(sysfs_root) != Path("/"):
        opt("--sysfs-root", _path(sysfs_root))
    return out


def service_unit(state_dir, cfg, exe: str | None = None, *, bundle=None, trusted_keys=None,
                 backend: str = "auto", sysfs_root=None) -> str:
    """A systemd unit that runs the agent from the microphone, with every option of ``cfg`` (and the
    bundle, trusted keys, backend given), and restarts it on failure."""
    args = unit_options(cfg, bundle=bundle, trusted_keys=trusted_keys, backend=backend, sysfs_root=sysfs_root)
    extra = "".join(" " + shlex.quote(a) for a in args)
    if exe is None:
        import shutil

        exe = shutil.which("edgelearn") or f"{sys.executable} -m edge.cli"
    # systemd expands specifiers (%h, %s...) in both settings: a literal % is written %%
    return UNIT.format(exe=exe.replace("%", "%%"), state=shlex.quote(_path(state_dir)).replace("%", "%%"),
                       extra=extra.replace("%", "%%"), cwd=str(Path.cwd().resolve()).replace("%", "%%"))
