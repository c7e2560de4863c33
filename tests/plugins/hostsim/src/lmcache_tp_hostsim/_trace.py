"""One JSON line per traced action, appended to ``$LMCACHE_TEST_HOSTSIM_TRACE`` if set."""

from __future__ import annotations

import json
import os
from typing import Any


def trace(action: str, **fields: Any) -> None:
    path = os.environ.get("LMCACHE_TEST_HOSTSIM_TRACE")
    if not path:
        return
    with open(path, "a") as out:
        out.write(json.dumps({"action": action, "pid": os.getpid(), **fields}) + "\n")
