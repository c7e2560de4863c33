"""Upstream LMCache 0.5.6's ``lmcache.v1.internal_api_server``: HTTP routes for operating a
running process (environment, log levels, threads, periodic threads, metrics and the
opt-in ``/run_script``).

Only the engine-independent :mod:`.common` group is provided; upstream's in-process
engine's own API server (its controller and vLLM routes) is not.  The routes are mounted
by ``lmcache server``'s HTTP frontend and, through
:mod:`lmcache.v1.multiprocess.http_apis.common_api`, by
:class:`~lmcache.v1.multiprocess.http_api_registry.HTTPAPIRegistry`.
"""
