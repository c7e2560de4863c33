"""The device-plugin conformance suite, shipped in the core wheel.

Run it against an installed backend from any folder::

    pip install "lmcache-core[testing]" ./my-plugin
    pytest --pyargs lmcache.testing --lmcache-backend NAME

(or ``LMCACHE_TESTING_BACKEND=NAME``; default: the backend this process would select).
It checks the registry rules, fail-soft native loading, the ops against the torch baseline
bit for bit across dtypes and every ``EngineKVFormat``, the IPC wrapper round trip, event
IPC ordering across processes (where the backend declares an event IPC backend), and KV
on the backend's device through a real ``lmcache server`` and back, bit-exact, in each
transfer mode the backend declares.  A check the backend's spec does not declare is
skipped with the reason; so is everything that needs the device on a host without it.
pytest and hypothesis come with the ``testing`` extra; nothing in the library imports
this package.
"""

from __future__ import annotations

BACKEND_OPTION = "--lmcache-backend"
BACKEND_ENV_VAR = "LMCACHE_TESTING_BACKEND"
EXAMPLES_ENV_VAR = "LMCACHE_TESTING_EXAMPLES"
