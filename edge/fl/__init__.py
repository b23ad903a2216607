"""The federated-learning client of a Linux device, in three parts:

- ``client``: the protocol (check in, install the task's bundle, train the head, encode and upload
  the delta, drive a secure-aggregation round) and the state that survives a power cut (the last
  sequence number, top-k residuals, the bundle store);
- ``transport``: HTTP to the aggregator (keep-alive, one reconnect), ``FLError`` and ``DeviceRevoked``
  (``aggregator revoke``);
- ``model``: the federated head (``head.npz``): its logits, local training, reading it from a bundle;
- ``local``: the device's own examples for a round (``local_examples``: labelled clips, augmented,
  ambient negatives, confident detections), what the agent and the fleet simulator both train on.

    from edge.fl import FLClient
    client = FLClient("http://agg:8470", "pi-001", key, "/var/lib/edgelearn/fl",
                      trusted_keys="/etc/edgelearn/keys", data=(X, y))
    client.run_once({"battery": 0.9, "charging": True, "network": "wifi"})
"""

from edge.fl.client import CODECS, FLClient  # noqa: F401
from edge.fl.local import local_examples  # noqa: F401
from edge.fl.model import HEAD_FILE, FederatedHeadTrainer, load_head, head_logits  # noqa: F401
from edge.fl.transport import DeviceRevoked, FLError, HttpTransport, call  # noqa: F401
