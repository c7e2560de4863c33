"""The RPC table is the server's dispatch table: every operation names a handler the
cache server defines and a pool; the old module paths still export their public names."""

from __future__ import annotations

import importlib
import inspect

import pytest

from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.transport import bind_handlers
from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.protocol import RPC_SPECS, Access, Pool, RpcSpec

# Requests of one client that must run in its order (registration before its transfers,
# prepare before commit) share that client's affinity executor.
_ORDERED = {
    "register_kv_cache",
    "unregister_kv_cache",
    "store",
    "retrieve",
    "register_kv_cache_engine_driven_context",
    "unregister_kv_cache_engine_driven_context",
    "set_engine_driven_sub_path",
    "prepare_store",
    "commit_store",
    "prepare_retrieve",
    "commit_retrieve",
    "commit_store_frames",
    "retrieve_frames",
}


@pytest.mark.parametrize("name", sorted(RPC_SPECS))
def test_every_operation_has_a_handler_taking_its_payloads(name: str) -> None:
    spec = RPC_SPECS[name]
    method = getattr(MPCacheServer, spec.handler, None)
    assert callable(method), f"{name}: MPCacheServer has no {spec.handler}"
    # Payloads are passed positionally: the handler must take all of them and need no more
    # than the required ones.
    params = list(inspect.signature(method).parameters.values())[1:]  # without self
    required = [p for p in params if p.default is inspect.Parameter.empty]
    # Operations with data frames get them as one more (last) argument.
    data = 1 if spec.bulk_frames else 0
    assert len(required) <= spec.min_payloads + data, f"{name}: handler needs {required}"
    assert len(params) >= len(spec.payloads) + data, f"{name}: handler takes only {params}"
    assert isinstance(spec.pool, Pool)


def test_ordered_operations_run_in_the_client_affinity_pool() -> None:
    affinity = {name for name, spec in RPC_SPECS.items() if spec.pool is Pool.AFFINITY}
    assert affinity == _ORDERED


def test_bulk_frames_need_every_payload_and_bound_the_request() -> None:
    with pytest.raises(ValueError, match="every payload required"):
        RpcSpec(
            "x",
            (("a", int), ("b", int)),
            bool,
            required=1,
            bulk_frames=4,
            access=Access.CALLER,
        )
    spec = RPC_SPECS["commit_store_frames"]
    frames = [b"p"] * len(spec.payloads) + [b""] * spec.bulk_frames
    payloads, bulk = protocol.split_bulk(spec, frames)
    assert len(payloads) == len(spec.payloads) and len(bulk) == spec.bulk_frames
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.split_bulk(spec, [*frames, b""])
    assert info.value.code is protocol.ErrorCode.MESSAGE_TOO_LARGE
    noop = RPC_SPECS["noop"]
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.split_bulk(noop, [b""] * (protocol.MAX_PAYLOAD_FRAMES + 1))
    assert info.value.code is protocol.ErrorCode.MESSAGE_TOO_LARGE
    assert protocol.split_bulk(noop, [b""]) == ([b""], ())  # decode_payloads names it


def test_the_handler_defaults_to_the_operation_and_can_be_named() -> None:
    assert RpcSpec("noop", (), str, access=Access.READ).handler == "noop"
    assert RpcSpec("noop", (), str, handler="ping", access=Access.READ).handler == "ping"


def test_a_table_entry_without_a_method_fails_at_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = dict(
        RPC_SPECS, noop=RpcSpec("noop", (), str, handler="no_such_method", access=Access.READ)
    )
    monkeypatch.setattr(protocol, "RPC_SPECS", broken)
    with pytest.raises(TypeError, match="no_such_method"):
        bind_handlers(object.__new__(MPCacheServer))


def test_bound_handlers_are_the_engine_methods() -> None:
    engine = object.__new__(MPCacheServer)
    handlers = bind_handlers(engine)
    assert set(handlers) == set(RPC_SPECS)
    assert handlers["store"] == engine.store
    assert handlers["lookup"].__self__ is engine


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            "lmcache.v1.multiprocess.server",
            [
                "MPServer",
                "build_cache_server",
                "run_server",
                "main",
                "check_l1_fits",
                "parse_l2_adapter",
                "start_frontends",
                "AffinityThreadPool",
                "RateLimitedErrorLog",
                "MPCacheServer",
                "CacheServerSettings",
            ],
        ),
        (
            "lmcache.v1.multiprocess.mp_cache_server",
            [
                "MPCacheServer",
                "CacheServerSettings",
                "MAX_REGISTERED_WORKERS",
                "MAX_PENDING_TRANSFERS",
                "DIRECT_SUB_PATH",
            ],
        ),
    ],
)
def test_old_module_paths_still_export_their_names(module: str, names: list[str]) -> None:
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{module} lost {missing}"
