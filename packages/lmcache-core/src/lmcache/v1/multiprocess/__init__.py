"""lmcache MP mode: the cache server, its wire protocol and the worker-side client.

Start a server with ``lmcache server``; connect a worker with
:class:`lmcache.v1.multiprocess.worker.KVCacheWorker`.

Sub-packages by audience: ``wire/`` (what both ends agree on: RPC table, payload types,
chunk hashing, admin-token rules), ``server/`` (the ZMQ transport and the handler),
``worker/`` (client and worker); ``transfer_context/`` holds the worker-side transfer
contexts.  ``config.py``, ``transfer_mode.py``, ``kv_layout.py``, ``custom_types.py``,
``http_server.py``, ``mp_cache_server.py`` and ``client.py`` keep the paths the seeds,
upstream and earlier releases use.
"""
