"""Partitioner: profiles, graph analysis checked against TFLite Micro and Vela,
plan verdicts, the report and partition commands, and the MCU tensor blob."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge.cli import main as cli
from host.partition.blob import read_blob
from host.partition.graph import ModelError, load_graph
from host.partition.memory import plan_arena
from host.partition.plan import plan_partition
from host.partition.profiles import ProfileError, available_profiles, load_profile

SHAPES = [(64, 4), (32, 3), (16, 2), (48, 1)]


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    from host.partition.zoo import variant_tflite
    d = tmp_path_factory.mktemp("zoo")
    return {s: variant_tflite(*s, cache_dir=d) for s in SHAPES}


def tflm_arena(model: Path) -> int:
    """Arena TFLite Micro really used, from its RecordingMicroAllocator (in a subprocess:
    TFLM aborts the process on errors and prints to the C stderr)."""
    code = ("import sys, numpy as np; from tflite_micro import runtime\n"
            "it = runtime.Interpreter.from_bytes(open(sys.argv[1], 'rb').read(), arena_size=1 << 22)\n"
            "d = it.get_input_details(0); it.set_input(np.zeros(d['shape'], d['dtype']), 0); it.invoke()\n"
            "it.print_allocations()\n")
    res = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    line = next(l for l in (res.stdout + res.stderr).splitlines() if "Arena allocation total" in l)
    return int(line.split("total")[1].split()[0])


def test_every_shipped_profile_loads():
    names = available_profiles()
    assert {"esp32", "esp32s3", "rpi4", "rpi5", "ethos-u55", "phone"} <= set(names)
    for n in names:
        p = load_profile(n)
        assert p.budget_bytes > 0 and p.cpu.macs_per_s > 0


@pytest.mark.parametrize("edit,match", [
    (("budget_bytes = 102400", ""), r"memory\.budget_bytes' is missing \(expected an integer in bytes\)"),
    (("budget_bytes = 102400", 'budget_bytes = "100k"'), r"memory\.budget_bytes' is str '100k', expected an integer"),
    (("rtt_ms = 30.0", "rtt_ms = -3.0"), r"link\.rtt_ms' is -3\.0, expected a non-negative"),
    (('tier = "bias-only"', 'tier = "tiny"'), r"adaptation\.tier' is 'tiny', expected one of"),
    (("budget_bytes = 102400", "budget_byte = 102400"), r"memory\.budget_byte' is not a known field \(did you mean 'budget_bytes'"),
    (("[link]", "[link"), r"is not valid TOML"),
])
def test_malformed_profile_names_file_and_field(tmp_path, edit, match):
    text = (Path(load_profile("esp32").source)).read_text().replace(*edit)
    f = tmp_path / "mine.toml"
    f.write_text(text)
    with pytest.raises(ProfileError, match=match) as e:
        load_profile(f)
    assert str(f) in str(e.value)


def test_user_profile_path_and_unknown_name(tmp_path):
    f = tmp_path / "big.toml"
    f.write_text(Path(load_profile("esp32").source).read_text().replace("budget_bytes = 102400", "budget_bytes = 999"))
    assert load_profile(f).budget_bytes == 999
    with pytest.raises(ProfileError, match="did you mean 'rpi4'"):
        load_profile("rpi44")


@pytest.mark.parametrize("shape", SHAPES)
def test_arena_within_5_percent_of_tflite_micro(zoo, shape):
    model = zoo[shape]
    predicted = plan_arena(load_graph(model)).arena_bytes
    measured = tflm_arena(model)
    assert abs(predicted - measured) <= 0.05 * measured, (predicted, measured)


def test_head_is_exactly_tflm_greedy_plan(zoo):
    code = ("import sys, numpy as np; from tflite_micro import runtime\n"
            "it = runtime.Interpreter.from_bytes(open(sys.argv[1], 'rb').read(), arena_size=1 << 22)\n"
            "it.print_allocations()\n")
    res = subprocess.run([sys.executable, "-c", code, str(zoo[(32, 3)])], capture_output=True, text=True)
    head = int(next(l for l in (res.stdout + res.stderr).splitlines() if "allocation head" in l).split()[-2])
    assert plan_arena(load_graph(zoo[(32, 3)])).head_bytes == head


@pytest.mark.parametrize("shape", [(64, 4), (16, 2)])
def test_macs_and_placement_equal_vela(zoo, shape):
    from host.partition.placement import vela_available, vela_report
    if not vela_available():
        pytest.skip("ethos-u-vela not installed")
    g = load_graph(zoo[shape])
    vela = vela_report(zoo[shape])
    copies = sum(l["macs"] for l in vela["layers"] if l["nng_op"] == "MemoryCopy")  # Vela-inserted
    assert g.total_macs == vela["macs"] - copies
    plan = plan_partition(g, load_profile("ethos-u55"))
    assert plan.totals["cpu_ops"] == vela["cpu_ops"]
    names = {"CONV_2D": "Conv2D", "DEPTHWISE_CONV_2D": "DepthwiseConv2D", "FULLY_CONNECTED": "FullyConnected",
             "MEAN": "Mean", "SOFTMAX": "Softmax", "AVERAGE_POOL_2D": "AvgPool", "MAX_POOL_2D": "MaxPool"}
    ours: dict[str, int] = {}
    for l in g.layers:
        if l.macs:
            ours[names[l.op]] = ours.get(names[l.op], 0) + l.macs
    theirs: dict[str, int] = {}  # Vela lowers one operator to several NPU ops; sum per operator type
    for l in vela["layers"]:
        if l["nng_op"] != "MemoryCopy" and l["macs"]:
            theirs[l["op"]] = theirs.get(l["op"], 0) + l["macs"]
    assert ours == theirs


def test_placement_agrees_with_vela_on_cpu_fallback(tmp_path):
    """SQRT has no Ethos-U55 kernel; a stride-4 VALID conv is one Vela rewrites for the NPU."""
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    from host.partition.placement import vela_available, vela_report
    from host.quantize import to_tflite
    if not vela_available():
        pytest.skip("ethos-u-vela not installed")
    L = tf.keras.layers
    inp = tf.keras.Input((16, 16, 4))
    x = L.Conv2D(8, 4, strides=4, padding="valid")(inp)
    x = L.Conv2D(8, 3, padding="same")(x)
    x = L.Lambda(lambda t: tf.math.sqrt(tf.abs(t) + 1.0))(x)
    x = L.Conv2D(4, 1)(x)
    f = tmp_path / "m.tflite"
    f.write_bytes(to_tflite(tf.keras.Model(inp, x), np.random.default_rng(0).normal(size=(8, 16, 16, 4))
                            .astype(np.float32)))
    g = load_graph(f)
    vela = vela_report(f)
    plan = plan_partition(g, load_profile("ethos-u55"))
    assert plan.totals["cpu_ops"] == vela["cpu_ops"] == 1
    sqrt = next(r for r in plan.layers if r["op"] == "SQRT")
    assert sqrt["engine"] == "cpu" and "SQRT is not in the NPU's int8 operator set" in sqrt["reason"]
    ours = plan_partition(g, load_profile("ethos-u55"), use_vela=False)
    assert ours.layers[0]["engine"] == "cpu" and "stride 4x4" in ours.layers[0]["reason"]


def test_unsupported_npu_op_falls_back_with_reason(zoo):
    g = load_graph(zoo[(16, 2)])
    g.layers[1].op = "CUMSUM"
    plan = plan_partition(g, load_profile("ethos-u55"), use_vela=False)
    row = plan.layers[1]
    assert row["engine"] == "cpu" and "CUMSUM is not in the NPU's int8 operator set" in row["reason"]


def test_float_model_on_int8_target_is_refused(tmp_path):
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from host.partition.zoo import _keras
    from host.quantize import to_tflite
    f = tmp_path / "float.tflite"
    f.write_bytes(to_tflite(_keras(8, 1, 4), None))
    g = load_graph(f)
    with pytest.raises(ModelError, match=r"computes in float \(layer 0 CONV_2D\) but esp32 runs int8 only; quantize"):
        plan_partition(g, load_profile("esp32"))
    assert plan_partition(g, load_profile("rpi4")).fits


def test_micropython_target_rejects_op_without_kernel(zoo):
    g = load_graph(zoo[(16, 2)])
    g.layers[3].op = "LSTM"
    with pytest.raises(ModelError, match=r"layer 3 \(LSTM\) has no MicroPython int8 kernel on esp32.*cut before layer 3"):
        plan_partition(g, load_profile("esp32"))


def test_does_not_fit_names_layer_bytes_and_alternative(zoo, tmp_path):
    f = tmp_path / "tiny.toml"
    f.write_text(Path(load_profile("esp32").source).read_text()
                 .replace("budget_bytes = 102400", "budget_bytes = 20000")
                 .replace("max_latency_ms = 1000.0", "max_latency_ms = 100000.0"))
    plan = plan_partition(load_graph(zoo[(64, 4)]), load_profile(f))
    assert not plan.fits
    assert plan.verdict.startswith("does not fit: layer ")
    assert "KB over the 20 KB heap; try the c" in plan.verdict and "cloud split" in plan.verdict


def test_esp32_gets_a_smaller_variant_for_compute(zoo):
    big = plan_partition(load_graph(zoo[(64, 4)]), load_profile("esp32"))
    assert not big.fits and "variant" in big.verdict
    small = plan_partition(load_graph(zoo[(16, 2)]), load_profile("esp32"))
    assert small.fits and small.verdict.startswith("fits: ") and "of 100 KB heap" in small.verdict


def test_bias_only_report_is_6_5x_below_full(zoo):
    t = plan_partition(load_graph(zoo[(64, 4)]), load_profile("ethos-u55")).totals["training_bytes"]
    assert t["full"] >= 6.5 * t["bias-only"]


def test_split_prefers_device_on_fast_link_and_cloud_on_slow_cpu(zoo, tmp_path):
    from host.partition.placement import best_split
    g = load_graph(zoo[(64, 4)])
    assert best_split(g, load_profile("rpi5")).cut == len(g.layers)
    f = tmp_path / "slowpi.toml"
    f.write_text(Path(load_profile("rpi4").source).read_text().replace("macs_per_s = 5.0e9", "macs_per_s = 1.0e5"))
    s = best_split(g, load_profile(f))
    assert s.cut < len(g.layers) and s.tx_bytes > 0


def test_energy_objective_offloads_where_latency_keeps_local(zoo, capsys, tmp_path, monkeypatch):
    # rpi4: 0.5 ms of local compute beats a 20 ms round trip, but 2 mJ of compute
    # costs more than sending the 490-byte input (25 uJ)
    monkeypatch.chdir(tmp_path)  # the chart goes to the current directory
    path = str(zoo[(64, 4)])
    assert cli(["report", path, "--target", "rpi4", "--json", "--objective", "latency"]) == 0
    lat = json.loads(capsys.readouterr().out)["split"]
    assert cli(["report", path, "--target", "rpi4", "--json", "--objective", "energy"]) == 0
    en = json.loads(capsys.readouterr().out)["split"]
    assert lat["cut"] == len(load_graph(path).layers) and lat["tx_bytes"] == 0
    assert en["cut"] == 0 and en["tx_bytes"] == 490 and en["energy_mj"] < 0.1


def test_report_json_and_chart(zoo, tmp_path, capsys):
    chart = tmp_path / "m.png"
    rc = cli(["report", str(zoo[(32, 3)]), "--target", "ethos-u55", "--json", "--chart", str(chart)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and chart.read_bytes()[:4] == b"\x89PNG"
    assert {"macs", "weight_bytes", "arena_bytes", "training_bytes"} <= set(out["totals"])
    assert len(out["layers"]) == len(load_graph(zoo[(32, 3)]).layers)
    assert out["verdict"].startswith("fits: ")


def test_report_bad_inputs_are_one_line(tmp_path, capsys):
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"not a model at all")
    assert cli(["report", str(junk), "--target", "esp32"]) == 2
    assert "is not a TFLite flatbuffer" in capsys.readouterr().err
    assert cli(["report", str(tmp_path / "none.tflite")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("keep", [2000, 30000])
def test_truncated_model_is_one_clear_error(zoo, tmp_path, capsys, keep):
    cut = tmp_path / "cut.tflite"
    cut.write_bytes(zoo[(64, 4)].read_bytes()[:keep])
    assert cli(["report", str(cut), "--target", "esp32"]) == 2
    assert "is a damaged TFLite flatbuffer" in capsys.readouterr().err


def test_partition_writes_signed_bundle_with_blob(zoo, tmp_path, capsys):
    from edge.bundle import load_bundle
    from host.keys import generate_keypair
    priv, pub = generate_keypair(tmp_path / "keys")
    out = tmp_path / "b"
    rc = cli(["partition", str(zoo[(16, 2)]), "--target", "esp32", "--out", str(out), "--key", str(priv),
              "--labels", ",".join(f"k{i}" for i in range(12))])
    assert rc == 0, capsys.readouterr().err
    b = load_bundle(out, trusted_keys=pub)
    m = json.loads((out / "manifest.json").read_text())
    assert {p["format"] for p in m["partitions"]} == {"tflite", "mpy-blob"}
    assert m["trainable"]["strategy"] == "bias-only" and m["target"]["name"] == "esp32"
    g = load_graph(zoo[(16, 2)])
    tensors = read_blob(out / "weights.elb")
    consts = [t for t in g.tensors if t.is_const and t.dtype in ("int8", "int32")]
    assert [t["name"] for t in tensors] == [t.name for t in consts]
    for got, want in zip(tensors, consts):
        assert np.array_equal(got["data"], want.data) and tuple(got["scales"]) == pytest.approx(want.scales)
    assert b is not None
    # the bundle (directory or .zip) is itself something `report` reads
    from host.bundle import zip_bundle
    z = zip_bundle(out, tmp_path / "b.zip")
    for src in (out, z):
        capsys.readouterr()
        assert cli(["report", str(src), "--target", "esp32", "--json", "--chart", str(tmp_path / "c.png")]) == 0
        assert json.loads(capsys.readouterr().out)["totals"]["macs"] == g.total_macs


def test_ethos_bundle_carries_the_vela_compiled_model(zoo, tmp_path, capsys):
    from host.keys import generate_keypair
    from host.partition.placement import vela_available
    if not vela_available():
        pytest.skip("ethos-u-vela not installed")
    priv, _ = generate_keypair(tmp_path / "keys")
    out = tmp_path / "b"
    assert cli(["partition", str(zoo[(16, 2)]), "--target", "ethos-u55", "--out", str(out), "--key", str(priv),
                "--labels", "a"]) == 0, capsys.readouterr().err
    parts = {p["name"]: p for p in json.loads((out / "manifest.json").read_text())["partitions"]}
    npu = parts["encoder-ethos-u"]
    assert npu["placement"] == "npu" and npu["file"].endswith("_vela.tflite")
    assert any(l.op == "CUSTOM:ethos-u" for l in load_graph(out / npu["file"]).layers)


def test_partition_refuses_model_that_does_not_fit(zoo, tmp_path, capsys):
    from host.keys import generate_keypair
    priv, _ = generate_keypair(tmp_path / "keys")
    out = tmp_path / "b"
    rc = cli(["partition", str(zoo[(64, 4)]), "--target", "esp32", "--out", str(out), "--key", str(priv),
              "--labels", "a"])
    assert rc == 2 and not out.exists()
    assert "too slow" in capsys.readouterr().err


@pytest.mark.micropython
def test_docs_blob_loader_runs_on_micropython(zoo, tmp_path, micropython, root):
    """The loader printed in docs/partition.md, run by the real MicroPython, reads what write_blob wrote."""
    from host.partition.blob import write_blob
    blob = write_blob(load_graph(zoo[(16, 2)]), tmp_path / "w.elb")
    doc = (root / "docs" / "partition.md").read_text()
    code = "import struct, array\n\ndef load_blob" + doc.split("import struct, array\n\ndef load_blob")[1].split("```")[0]
    out = micropython(code + f"\nt = load_blob({str(blob)!r})\n"
                      "for k in sorted(t):\n    print(k, len(t[k][4]), sum(t[k][4]), len(t[k][2]))\n")
    want = sorted((t["name"], t["data"].size, int(t["data"].astype(np.int64).sum()), len(t["scales"]))
                  for t in read_blob(blob))
    got = [l.rsplit(" ", 3) for l in out.strip().splitlines()]
    assert [(n, int(a), int(b), int(c)) for n, a, b, c in got] == want


def test_shipped_model_against_tflite_micro_and_vela(root):
    """The shipped encoder: arena within 5 % of TFLM, MACs equal Vela's, bias-only >= 6.5x below full."""
    from host.partition.placement import vela_available, vela_report
    model = root / "models" / "kws-dscnn-s" / "encoder_int8.tflite"
    if not model.exists():
        pytest.skip("models/kws-dscnn-s has not been built yet (make model)")
    g = load_graph(model)
    measured = tflm_arena(model)
    assert abs(plan_arena(g).arena_bytes - measured) <= 0.05 * measured
    plan = plan_partition(g, load_profile("ethos-u55"), use_vela=False)
    t = plan.totals["training_bytes"]
    assert t["full"] >= 6.5 * t["bias-only"]
    if vela_available():
        v = vela_report(model)
        copies = sum(l["macs"] for l in v["layers"] if l["nng_op"] == "MemoryCopy")
        assert g.total_macs == v["macs"] - copies and plan.totals["cpu_ops"] == v["cpu_ops"]
