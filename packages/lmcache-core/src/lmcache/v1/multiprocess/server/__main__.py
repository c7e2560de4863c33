"""``python -m lmcache.v1.multiprocess.server``: the cache server without the CLI."""

from lmcache.v1.multiprocess.server.run import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
