"""``lmcache keys``: CurveZMQ key pairs for an authenticated, encrypted RPC port.

``lmcache keys new NAME`` writes ``NAME.key`` (the public key: give it to the other side)
and ``NAME.key_secret`` (mode 0600: keep it) in ``zmq.auth``'s certificate format.  The
server takes its secret file with ``--curve-secret-key-file`` and a directory of client
public keys with ``--authorized-keys``; a client takes its secret file and the server's
public file (``KVCacheWorker(curve_secret_key_file=..., curve_server_key_file=...)``, or
the vLLM keys ``lmcache.mp.curve_secret_key_file`` / ``lmcache.mp.curve_server_key_file``).
``lmcache keys show FILE`` prints a key file's public key.
"""

from __future__ import annotations

import argparse
from typing import Any

from lmcache.v1.multiprocess.wire.curve import read_key_file, write_key_pair


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "keys",
        help="Make CurveZMQ key pairs for the server and its clients.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    new = actions.add_parser(
        "new",
        help="Write NAME.key (public) and NAME.key_secret (secret, mode 0600).",
        description="Write a fresh CURVE key pair; existing files are never overwritten.",
    )
    new.add_argument("name", metavar="NAME", help="File name of the pair (no '/').")
    new.add_argument(
        "--dir",
        default=".",
        metavar="DIR",
        help="Directory to write to (made if missing; default: the current directory).",
    )
    new.set_defaults(func=run_new)
    show = actions.add_parser(
        "show",
        help="Print the public key of a key file.",
        description="Print the Z85 public key of a NAME.key or NAME.key_secret file.",
    )
    show.add_argument("file", metavar="FILE", help="A NAME.key or NAME.key_secret file.")
    show.set_defaults(func=run_show)


def run_new(args: argparse.Namespace) -> int:
    public, secret = write_key_pair(args.dir, args.name)
    print(f"public key: {public}  (copy it to the server's --authorized-keys directory,")
    print("            or, for the server's own pair, to every client)")
    print(f"secret key: {secret}  (mode 0600; never share it)")
    return 0


def run_show(args: argparse.Namespace) -> int:
    public, _secret = read_key_file(args.file, need_secret=False)
    print(public.decode())
    return 0
