"""Federated aggregation strategies (server side): small objects the aggregator composes.

    from host.fl import make_strategy
    s = make_strategy("fedavg")
"""

from host.fl.strategies import (FedAvg, FedAvgM, FedProx, Median, Strategy, TrimmedMean,  # noqa: F401
                                make_strategy)
