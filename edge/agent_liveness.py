"""Whether the agent that wrote ``agent.json`` still runs: a kill -9 or a power cut ends it without its
last write, and the file then says "running" or "adapting" for ever. ``read_status`` (edge/agent.py)
passes what it read through ``settle``: a recorded state of a live agent whose process is gone (no
such pid, a zombie, another program under the pid, or another boot) reads as ``"ended"`` with a note.

Split from agent.py to keep each file about one thing; ``Agent`` records ``boot_id()`` in agent.json.

    >>> settle({"state": "running", "pid": 4242, ...})["state"]   # 4242 was killed
    'ended'
"""

from __future__ import annotations

import os
from pathlib import Path

from edge.atomic import pid_alive

LIVE_STATES = ("starting", "running", "adapting")  # what only a running agent writes
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str | None:
    """This boot's id (Linux), or None: a pid recorded under another boot is not this boot's process."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def pid_running(pid: int, proc=Path("/proc")) -> bool:
    """Whether ``pid`` is a live process that could be the agent. Unknown (no /proc, another user's
    process) counts as live: only a sure sign ends an agent."""
    if pid == os.getpid():
        return True
    if not pid_alive(pid):
        return False
    try:
        stat = (proc / str(pid) / "stat").read_text()
        if stat[stat.rfind(")") + 2:][:1] in ("Z", "X"):  # killed, not yet reaped by its parent
            return False
        cmd = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:  # no /proc (or it went away meanwhile: the next read says so)
        return True
    # the pid taken by another program after a reboot or a wrap: the agent is edgelearn (the script
    # or `python -m edge.cli`), or Python running edge.agent from a script
    return not cmd or b"edge" in cmd or b"python" in cmd


def settle(data: dict) -> dict:
    """``agent.json`` as read, with ``state`` "ended" (and a ``note``) when it says the agent runs and
    its process is gone; ``adapting`` is then false too (the adaptation child dies with the agent)."""
    pid = data.get("pid")
    if data.get("state") not in LIVE_STATES or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return data
    boot = data.get("boot_id")
    other_boot = isinstance(boot, str) and boot_id() not in (None, boot)
    if not other_boot and pid_running(pid):
        return data
    return {**data, "state": "ended", "was": data.get("state"), "adapting": False,
            "note": f"the agent (pid {pid}) is not running: it ended without stopping (killed or power cut)"}
