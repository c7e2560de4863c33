"""Tenant A (through the vLLM connector's link and worker side) against tenant B (an
engine ``KVCacheWorker``) on a server with CURVE keys and ``--tenants-file``.  No vLLM."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from lmcache.integration.vllm.mp_client import ServerLink
from lmcache.integration.vllm.mp_config import parse_extra_config
from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestMetadata, LoadStoreOp
from lmcache.integration.vllm.worker_side import WorkerSide
from lmcache.v1.multiprocess.wire.curve import CurveClientKeys, write_key_pair
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.worker.client import MPClient, ServerError
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

BLOCK_SIZE, CHUNK_SIZE, NUM_HEADS, HEAD_SIZE = 16, 32, 2, 8
# LMCache-driven on CPU moves the KV cache into shared memory in place, which needs pages of
# its own (cpu_shm_remap): over glibc's largest mmap threshold (32 MiB), as vLLM's are.
NUM_BLOCKS = 33 * 1024**2 // (NUM_HEADS * BLOCK_SIZE * 2 * HEAD_SIZE * 4) + 1
PROMPT = tuple(range(500, 500 + 2 * CHUNK_SIZE))
TENANTS = """
tenants:
  team-a: {keys: [alice], salts: [a]}
  team-b: {keys: [bob], salts: [b]}
"""


@pytest.fixture
def keyed(tmp_path: Path, small_server: Callable[..., str]) -> dict[str, object]:
    server_public, server_secret = write_key_pair(tmp_path / "server", "server")
    secrets = {}
    for name in ("alice", "bob"):
        _public, secrets[name] = write_key_pair(tmp_path / "authorized", name)
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    extra = {
        name: {
            "lmcache.mp.curve_secret_key_file": str(secret),
            "lmcache.mp.curve_server_key_file": str(server_public),
        }
        for name, secret in secrets.items()
    }
    url = small_server(
        "--chunk-size", str(CHUNK_SIZE),
        "--curve-secret-key-file", str(server_secret),
        "--authorized-keys", str(tmp_path / "authorized"),
        "--tenants-file", str(tmp_path / "tenants.yaml"),
        curve=CurveClientKeys.from_files(secrets["bob"], server_public),
    )  # fmt: skip
    return {"url": url, "extra": extra, "server_public": server_public, "secrets": secrets}


@pytest.fixture(params=["engine_driven", "lmcache_driven"])
def connector_a(
    request: pytest.FixtureRequest, keyed: dict[str, object]
) -> Iterator[tuple[ServerLink, WorkerSide]]:
    extra = dict(keyed["extra"]["alice"])  # type: ignore[index]
    config = parse_extra_config({**extra, "lmcache.mp.mp_transfer_mode": request.param}, env={})
    link = ServerLink(str(keyed["url"]), 30.0, "", BLOCK_SIZE, curve=config.curve)
    assert link.open()
    worker = WorkerSide(link, config, "m", 1, BLOCK_SIZE)
    kv = {
        f"layer.{i}": torch.randn(NUM_BLOCKS, NUM_HEADS, BLOCK_SIZE, 2 * HEAD_SIZE)
        for i in range(2)
    }
    worker.register_kv_caches(kv, NUM_HEADS, HEAD_SIZE)
    try:
        yield link, worker
    finally:
        worker.close()
        link.close()


def _item(salt: str, tokens: tuple[int, ...] = PROMPT) -> LMCacheMPRequestMetadata:
    op = LoadStoreOp(tokens, (tuple(range(len(tokens) // BLOCK_SIZE)),), 0, len(tokens))
    return LMCacheMPRequestMetadata("req", op, salt)


def _lookup(link: ServerLink, salt: str, tokens: tuple[int, ...] = PROMPT) -> int | None:
    """As the connector's scheduler side: lookup, then the prefetch status (chunks)."""
    key = IPCCacheServerKey.from_token_ids("m", 1, None, tokens, request_id="q", cache_salt=salt)

    def call(client: MPClient) -> int | None:
        client.lookup(key, 1)
        try:
            return client.wait_prefetch_status("q", 5.0)  # type: ignore[no-any-return]
        finally:
            client.end_session("q")

    return link.run("lookup", call)


def _bob(keyed: dict[str, object]) -> KVCacheWorker:
    kv = [torch.randn(2, 16, 4, 2, 8) for _ in range(2)]
    return KVCacheWorker(
        kv,
        model_name="m",
        server_url=str(keyed["url"]),
        mode="engine_driven",
        sub_path="inline",
        curve_secret_key_file=str(keyed["secrets"]["bob"]),  # type: ignore[index]
        curve_server_key_file=str(keyed["server_public"]),
    )


def test_connector_tenant_cannot_read_or_plant_in_another_tenant(
    keyed: dict[str, object], connector_a: tuple[ServerLink, WorkerSide]
) -> None:
    link, a = connector_a
    bob = _bob(keyed)
    try:
        assert bob.store(PROMPT, list(range(16)))
        assert bob.lookup(PROMPT) == len(PROMPT)
        # A's own (default) salt: other hashes, a miss; B's salt: refused.
        assert _lookup(link, "") == 0
        with pytest.raises(ServerError, match="forbidden"):
            _lookup(link, "b")
        a.load([_item("b")])
        assert a.take_load_errors(), "a load under another tenant's salt must fail"
        planted = tuple(t + 10_000 for t in PROMPT)
        a.stats.take()
        a.store([_item("b", planted)])
        taken = a.stats.take()
        assert taken is not None and taken["failed_stores"] == 1
        assert bob.lookup(planted) == 0
        # A's own chunks round-trip through the connector.
        a.store([_item("", planted)])
        assert _lookup(link, "", planted) == 2
        assert bob.lookup(planted) == 0
    finally:
        bob.close()
