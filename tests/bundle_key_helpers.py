"""What the QA pass 3 bundle tests share: the shipped MCU bundle (skip where it is not shipped) and
the default trusted keys (no $EDGELEARN_KEYS, the shipped release keys trusted)."""

from __future__ import annotations

import pytest

from edge.kws import MODELS

MCU = MODELS / "kws-mcu-tcnn"
needs_mcu = pytest.mark.skipif(not (MCU / "manifest.json").is_file(), reason="MCU bundle not shipped")


@pytest.fixture(autouse=True)
def _default_keys(monkeypatch):
    monkeypatch.delenv("EDGELEARN_KEYS", raising=False)
    monkeypatch.delenv("EDGELEARN_NO_SHIPPED_KEYS", raising=False)
