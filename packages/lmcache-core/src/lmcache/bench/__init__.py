"""Benchmarks behind ``lmcache bench <name>``.

Each module here exposes ``add_arguments(parser)`` and ``run(args) -> int`` and is
discovered by :mod:`lmcache.cli.commands.bench`.  Benchmarks measure the candidate, the
baseline and a memcpy bound side by side in one run and print ratios, because absolute
times on shared machines are not comparable between runs.
"""
