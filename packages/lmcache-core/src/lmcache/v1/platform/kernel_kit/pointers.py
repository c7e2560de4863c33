"""Kit path of :mod:`lmcache.v1.platform.kv_pointers`, the plugin guide's public name for it.

The module lives one level down, beside the KV format table, because the torch baseline
uses it too and the baseline must not depend on the kit (the kit's ops fall back to the
baseline). This name is that module itself: ``sys.modules`` maps it there, so attributes
(private ones included) are the same objects and ``monkeypatch`` on either name works.
"""

from __future__ import annotations

import sys

from lmcache.v1.platform import kv_pointers as _module
from lmcache.v1.platform.kv_pointers import *  # noqa: F403 - the static view for type checkers

sys.modules[__name__] = _module
