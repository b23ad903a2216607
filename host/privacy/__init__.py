"""User-level differential privacy and secure aggregation for federated rounds.

    from host.privacy import RdpAccountant
    acc = RdpAccountant(); acc.step(q=0.05, noise_multiplier=1.1, steps=100)
    acc.epsilon(1e-5)
"""

from host.privacy.accountant import RdpAccountant  # noqa: F401
from host.privacy.dp import DPStrategy  # noqa: F401
