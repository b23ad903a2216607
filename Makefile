# The two commands a newcomer needs (README.md):
#   make demo   - set everything up, then run the end-to-end demo on the shipped model
#   make test   - set everything up, then run the whole test suite
# Heavier targets:
#   make model  - rebuild models/kws-dscnn-s from scratch (corpus, training, int8, bundle)
#   make bench  - run every benchmark and write bench/results/*.json
#   make wheel-check - build the wheel, install it in a fresh venv outside the checkout, run the commands
PY := .venv/bin/python

.PHONY: setup demo test model bench wheel-check
setup:
	@bash scripts/bootstrap.sh

demo: setup
	$(PY) -m edge.cli demo

test: setup
	@bash scripts/run_tests.sh

wheel-check: setup
	@bash scripts/check_wheel.sh

model: setup
	@bash scripts/model_deps.sh
	$(PY) -m edge.cli model --out models/kws-dscnn-s

bench: setup .venv-mlserver/bin/mlserver .venv-peers/bin/python .venv-wyoming-oww/bin/python .venv-mww/bin/python .venv-flower/bin/python
	$(PY) -m edge.cli bench

# MLServer pins starlette < 0.47 and breaks with uvloop >= 0.22, so the
# serving benchmark's reference lives in its own virtualenv.
.venv-mlserver/bin/mlserver:
	python3 -m venv .venv-mlserver
	.venv-mlserver/bin/pip install -q mlserver==1.7.1 onnxruntime 'uvloop<0.22'

# bench/wyoming_latency's reference, Home Assistant's openWakeWord server (it pins its own wyoming
# and tflite-runtime), in its own virtualenv too. numpy < 2: its tflite-runtime-nightly wheel is
# built against numpy 1, and under numpy 2 the server's feature thread dies at its first chunk
# (it then answers every stream, detecting nothing).
.venv-wyoming-oww/bin/python:
	python3 -m venv .venv-wyoming-oww
	.venv-wyoming-oww/bin/pip install -q wyoming-openwakeword==1.8.2 'numpy<2'

# bench/esphome_export's reference and the check that an `edgelearn export esphome` model loads where
# ESPHome users test theirs: pymicro-wakeword (microWakeWord's released models, TFLite's C library)
# and pymicro-features (the TFLite Micro audio front end), in their own virtualenv.
.venv-mww/bin/python:
	python3 -m venv .venv-mww
	.venv-mww/bin/python -m pip install -q pymicro-wakeword==2.5.0 pymicro-features==2.0.2

# bench/fleet_scale's reference: Flower's simulation engine (it pins its own Ray), in its own virtualenv.
.venv-flower/bin/python:
	python3 -m venv .venv-flower
	.venv-flower/bin/pip install -q 'flwr[simulation]==1.42.0'

# The keyword-spotting peers (PocketSphinx keyphrase spotting, ...) live in their own virtualenv
# too, never in edgelearn's dependencies: bench/peers/README.md.
.venv-peers/bin/python:
	@bash bench/peers/setup.sh
