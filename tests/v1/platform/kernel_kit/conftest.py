"""The kit's tests reuse the naive layout model of the torch_ops conformance tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "torch_ops"))
