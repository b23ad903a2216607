"""The console command: every subcommand answers --help; device paths never import TensorFlow."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "edge.cli", *args], capture_output=True, text=True,
                          timeout=120, **kw)


def test_top_level_help_lists_every_command():
    res = run("--help")
    assert res.returncode == 0
    for name in COMMANDS:
        assert name in res.stdout


def test_unknown_command_is_a_usage_error():
    res = run("frobnicate")
    assert res.returncode == 2 and "unknown command" in res.stderr


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_has_help(name):
    res = run(name, "--help")
    assert res.returncode == 0, res.stderr
    assert "usage: edgelearn " + name in res.stdout


@pytest.mark.parametrize("argv", [["device", "--help"], ["spot", "--help"], ["demo", "--help"]])
def test_device_commands_do_not_import_tensorflow(argv):
    code = ("import sys; from edge.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print('tensorflow' in sys.modules, 'host.train' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip().splitlines()[-1] == "False False", res.stdout + res.stderr


def test_user_error_is_one_line_exit_2(tmp_path):
    res = run("spot", str(tmp_path / "missing.wav"), "--bundle", str(tmp_path / "nope"))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_every_optional_import_has_a_one_line_message():
    """Every third-party module edge/ or host/ imports (at the top or lazily) is a base dependency
    or in the CLI's table of missing packages, so a command that hits it missing says one sentence."""
    import ast
    from pathlib import Path

    from edge.cli import _EXTRA_FOR
    root = Path(__file__).resolve().parents[1]
    base = {"numpy", "cryptography", "edge", "host", "firmware", "__future__"}
    seen = {}
    for top in ("edge", "host"):
        for p in (root / top).rglob("*.py"):
            if "portable" in p.parts:
                continue   # MicroPython-only fallbacks (micropython, ulab) are never hit on CPython
            for node in ast.walk(ast.parse(p.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
                for n in names:
                    seen.setdefault(n.split(".")[0], p.relative_to(root))
    missing = {m: str(p) for m, p in seen.items()
               if m not in sys.stdlib_module_names and m not in base and m not in _EXTRA_FOR}
    assert not missing, f"add these to edge.cli._EXTRA_FOR: {missing}"


def test_a_package_missing_while_a_command_runs_is_one_line():
    # flash imports mpremote only when it opens the board's port: hide it, and the command names the extra
    code = ("import sys; sys.modules['mpremote'] = None\n"
            "from edge.cli import main\n"
            "sys.exit(main(['flash', '--port', 'socket://127.0.0.1:9']))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "'mpremote'" in res.stderr and "edgelearn[flash]" in res.stderr, res.stderr


def test_bench_without_a_checkout_says_so_in_one_sentence(tmp_path):
    import os
    res = run("bench", env=dict(os.environ, EDGELEARN_SOURCE=str(tmp_path)))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "source checkout" in res.stderr


@pytest.mark.parametrize("content", [None, b"not an npz", b"PK\x03\x04broken"])
def test_a_bad_heldout_file_is_one_sentence(tmp_path, content):
    path = tmp_path / "heldout.npz"
    if content is not None:
        path.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "edge.cli", "aggregator", "init", "--state", str(tmp_path / "s"),
                        "--heldout", str(path)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("edgelearn aggregator: --heldout ") and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()  # nothing half-written


def test_an_unreadable_path_is_one_sentence_not_a_traceback(tmp_path):
    from edge import cli

    class Cmd:
        @staticmethod
        def add_arguments(p):
            p.add_argument("path")

        @staticmethod
        def run(args):
            open(args.path).read()

    import types
    mod = types.ModuleType("probe_cmd")
    mod.add_arguments, mod.run = Cmd.add_arguments, Cmd.run
    sys.modules["probe_cmd"] = mod
    try:
        cli.COMMANDS["probe"] = ("probe_cmd", "probe")
        assert cli.main(["probe", str(tmp_path / "missing.txt")]) == 2
    finally:
        cli.COMMANDS.pop("probe")
        sys.modules.pop("probe_cmd")


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng renders the word pairs")
def test_init_with_operating_negatives_keeps_them_beside_the_heldout_set(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path / "heldout.npz"
    np.savez(path, X=rng.standard_normal((20, 64)).astype(np.float32), y=rng.integers(0, 37, 20))
    r = subprocess.run([sys.executable, "-m", "edge.cli", "aggregator", "init", "--state", str(tmp_path / "s"),
                        "--heldout", str(path), "--operating-negatives", "12"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "s" / "heldout.npz") as z:
        assert z["neg_X"].shape[1] == 64 and len(z["neg_X"]) == len(z["neg_ends"]) > 20
        assert len(z["keywords"]) == 10 and float(z["neg_hours"]) > 0
    r = subprocess.run([sys.executable, "-m", "edge.cli", "aggregator", "init", "--state", str(tmp_path / "t"),
                        "--operating-negatives", "12"], capture_output=True, text=True)
    assert r.returncode == 2 and "--operating-negatives needs a held-out set" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "t").exists()


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """`edgelearn ... | head -1`: the reader closes the pipe while the command still prints; the
    command stops with SIGPIPE's status and no BrokenPipeError traceback."""
    (tmp_path / "chatty.py").write_text(
        "def add_arguments(p):\n    pass\n\n"
        "def run(args):\n    for i in range(200000):\n        print('line', i)\n    return 0\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from edge import cli\n"
            "cli.COMMANDS['chatty'] = ('chatty', 'prints many lines')\n"
            "sys.exit(cli.main(['chatty']))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 141 and err == "", err
