"""Old name of :mod:`lmcache.v1.platform.registry`, kept for the seeds, plugins and upstream code.

This name is the registry module itself, not a copy: ``sys.modules`` maps it to
:mod:`~lmcache.v1.platform.registry`, so its attributes are the same objects and
``monkeypatch.setattr`` on either name reaches the code that reads them.
"""

from __future__ import annotations

import sys

from lmcache.v1.platform import registry as _registry
from lmcache.v1.platform.registry import *  # noqa: F403 - the static view for type checkers

sys.modules[__name__] = _registry
