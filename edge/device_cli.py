"""Left only for ``bench/kws_base.py``, which imports these two names from here: the
``edgelearn device`` command is ``edge/commands/device.py``. Import
``edge.device.detection_models`` and ``edge.device.calibrated_for`` instead; delete this module
once nothing imports it.
"""

from __future__ import annotations

from edge.device import calibrated_for as _calibrated_for, detection_models as _models

__all__ = ["_calibrated_for", "_models"]
