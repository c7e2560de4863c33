"""What both ends of the MP connection agree on: the RPC table and its codec
(:mod:`.protocol`), the payload types (:mod:`.custom_types`), chunk hashing
(:mod:`.chunking`) and the admin-token rules (:mod:`.security`).

Imports nothing from :mod:`lmcache.v1.multiprocess.server` or ``.worker``.
"""
