"""The worker side of MP mode: the ZMQ request client (:mod:`.client`) and
:class:`KVCacheWorker` (:mod:`.kv_cache_worker`), which stores and retrieves paged KV
tensors through a server.  The transfer contexts the worker drives live in
:mod:`lmcache.v1.multiprocess.transfer_context` (the seed's path)."""

from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker, new_instance_id

__all__ = ["KVCacheWorker", "new_instance_id"]
