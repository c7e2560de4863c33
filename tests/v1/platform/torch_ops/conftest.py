"""Fixtures for the baseline-op conformance tests."""

from __future__ import annotations

from typing import Any

import pytest


class _SelectedOps:
    """Each op from the selected backend when it has it, else from the torch baseline."""

    def __init__(self) -> None:
        try:
            from lmcache import device_ops

            self._device_ops: Any = device_ops
        except Exception:  # the platform registry is optional for this suite
            self._device_ops = None
        from lmcache.v1.platform import torch_ops

        self._torch_ops = torch_ops

    def __getattr__(self, name: str) -> Any:
        # Prefer lmcache.device_ops so this suite tests whichever backend is selected
        # (that is how vendor plugins run it); fall back to the torch baseline for ops the
        # selected backend does not expose yet.
        if self._device_ops is not None:
            op = getattr(self._device_ops, name, None)
            if op is not None:
                return op
        return getattr(self._torch_ops, name)


@pytest.fixture(scope="session")
def ops() -> Any:
    return _SelectedOps()
