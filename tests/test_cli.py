"""The console command: every subcommand answers --help; device paths never import TensorFlow."""

import subprocess
import sys

import pytest

from edge.cli import COMMANDS


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
