"""Upstream LMCache 0.5.6's peer-to-peer settings: ``P2PConfig`` and its ``--p2p-*`` flags.

Upstream's MP server can serve and fetch KV chunks from peer servers found through the
coordinator.  **This server has no P2P transfer**: the type and flags exist so upstream
deployments and code parse the same way, and ``lmcache server`` logs a warning when
``--p2p-advertise-url`` (which turns P2P on upstream) is given.
"""

from __future__ import annotations

import argparse
import dataclasses

__all__ = ["DEFAULT_P2P_CONFIG", "P2PConfig", "add_p2p_args", "parse_args_to_p2p_config"]

_DEFAULT_TIMEOUT = 30.0
_DEFAULT_ENGINE = "nixl"


@dataclasses.dataclass
class P2PConfig:
    """Peer-to-peer KV transfer; on when ``advertise_url`` is set (upstream semantics)."""

    advertise_url: str = ""
    listen_url: str = ""
    lookup_timeout: float = _DEFAULT_TIMEOUT
    load_timeout: float = _DEFAULT_TIMEOUT
    transfer_engine: str = _DEFAULT_ENGINE

    @property
    def enabled(self) -> bool:
        return bool(self.advertise_url)

    @property
    def effective_listen_url(self) -> str:
        """Where to listen: ``listen_url``, else the advertised address."""
        return self.listen_url or self.advertise_url


DEFAULT_P2P_CONFIG = P2PConfig()


def add_p2p_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group(
        "P2P (upstream; not used by this server)",
        "Accepted for compatibility with upstream deployments; this server has no P2P "
        "transfer and logs a warning when --p2p-advertise-url is given.",
    )
    group.add_argument(
        "--p2p-advertise-url",
        default="",
        help="host:port advertised to peers (upstream: turns P2P on).",
    )
    group.add_argument(
        "--p2p-listen-url", default="", help="host:port to listen on (default: the advertised one)."
    )
    group.add_argument(
        "--p2p-lookup-timeout",
        type=float,
        default=_DEFAULT_TIMEOUT,
        help="Seconds before a peer lookup counts as a miss.",
    )
    group.add_argument(
        "--p2p-load-timeout",
        type=float,
        default=_DEFAULT_TIMEOUT,
        help="Seconds before a peer load counts as failed.",
    )
    group.add_argument(
        "--p2p-transfer-engine", default=_DEFAULT_ENGINE, help="Transfer-channel implementation."
    )
    return parser


def parse_args_to_p2p_config(args: argparse.Namespace) -> P2PConfig:
    """A :class:`P2PConfig` from the flags; flags the parser lacks keep their defaults."""
    return P2PConfig(
        advertise_url=getattr(args, "p2p_advertise_url", "") or "",
        listen_url=getattr(args, "p2p_listen_url", "") or "",
        lookup_timeout=getattr(args, "p2p_lookup_timeout", _DEFAULT_TIMEOUT),
        load_timeout=getattr(args, "p2p_load_timeout", _DEFAULT_TIMEOUT),
        transfer_engine=getattr(args, "p2p_transfer_engine", _DEFAULT_ENGINE),
    )
