"""The cloud-side serving shim: Open Inference Protocol v2 over ONNX Runtime.

Devices send it the clips they are unsure about (cascade) and the activations
of split models (split inference). Pieces, one job each: ``protocol`` (OIP
parsing and encoding), ``policy`` (token buckets, breakers, power of two
choices, canary decisions; pure, fake-clock tested), ``replica`` (a worker
process), ``pool`` (queue, batching, routing, deep checks), ``health``
(the probe input and output checks), ``rollout`` (stable and
canary versions), ``device`` (cascade and split endpoints), ``metrics``,
``app`` (Starlette routes) and ``cli`` (``edgelearn serve``). docs/serving.md
describes the behaviour and the knobs.

    $ edgelearn serve --bundle models/kws-dscnn-s --pubkey keys/edgelearn.pub --port 8000
"""
