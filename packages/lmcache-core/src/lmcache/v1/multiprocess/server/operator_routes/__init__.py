"""Operator routes that need no cache engine, one ``*_api`` module per group, each exposing
a FastAPI ``router`` (mounted by the HTTP frontend).

What an application may put on ``app.state`` for them (:mod:`.access`): ``authorize``, a
callable ``(request) -> Response | None`` that refuses requests lacking the admin token
(used by every route that reveals secrets' surroundings or changes the process);
``configs`` (``{"mp": MPServerConfig}``) or ``lmcache_adapter`` (with a ``config``) for
the ``/run_script`` opt-in; ``metrics_exposition``, a callable returning
``(body, content_type)`` for ``/metrics``; ``storage_manager``, the server's
:class:`~lmcache.v1.storage_backend.storage_manager.StorageManager`, for ``/quota``.
"""
