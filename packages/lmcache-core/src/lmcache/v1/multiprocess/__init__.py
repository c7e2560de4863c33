"""lmcache MP mode: the cache server, its wire protocol and the worker-side client.

Start a server with ``lmcache server``; connect a worker with
:class:`lmcache.v1.multiprocess.worker.KVCacheWorker`.
"""
