"""The seed's module paths keep every public name they had, as the very objects of the new
homes (plugins, upstream users and the server's ``--l2-adapter`` code import them)."""

from __future__ import annotations

import importlib

import pytest

OLD = "lmcache.v1.storage_backend."
NEW = "lmcache.v1.storage_backend."

# Every public top-level name the seed's modules defined, and where it lives now.
DISK_NAMES = {
    "chunk_format": [
        "CHECKSUM_CRC32",
        "CHECKSUM_NAMES",
        "CHECKSUM_XXH3_64",
        "CorruptFileError",
        "FORMAT_VERSION",
        "FORMAT_VERSION_CRC32",
        "MAGIC",
        "PREFIX_SIZE",
        "PayloadChecksum",
        "WRITE_CHECKSUM",
        "allocate_for_read",
        "checksum",
        "encode_header",
        "encode_prefix",
        "read_header",
    ],
    "disk_folder": [
        "DiskFolderError",
        "FILE_SUFFIX",
        "FOLDER_LAYOUT_VERSION",
        "FolderState",
        "MARKER_NAME",
        "TMP_SUFFIX",
        "classify_entry",
        "file_name_for",
        "fsync_directory",
        "inspect_disk_folder",
    ],
}
REDIS_NAMES = {
    "redis.settings": [
        "L2_ADAPTER_TYPES",
        "OPTION_PREFIX",
        "URL_SCHEMES",
        "RedisSettings",
        "is_redis_url",
    ],
    "redis.breaker": ["RedisStats"],
    "redis.connection": ["RedisUnavailableError"],
    "chunk_format": ["DecodedValue", "decode_value", "encode_value"],
    "redis.backend": ["RedisBackend"],
    "redis.factory": ["create_from_l2_adapter"],
}


def _cases(old: str, table: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    return [(old, home, name) for home, names in table.items() for name in names]


@pytest.mark.parametrize(
    ("old", "home", "name"),
    _cases("local_disk_backend", DISK_NAMES) + _cases("redis_backend", REDIS_NAMES),
)
def test_old_path_reexports_the_new_home(old: str, home: str, name: str) -> None:
    old_module = importlib.import_module(OLD + old)
    new_module = importlib.import_module(NEW + home)
    assert getattr(old_module, name) is getattr(new_module, name)


def test_redis_package_exports_the_backend_and_its_factory() -> None:
    package = importlib.import_module(NEW + "redis")
    assert package.RedisBackend is importlib.import_module(NEW + "redis.backend").RedisBackend
    for name in package.__all__:
        assert getattr(package, name) is not None, name


def test_disk_and_redis_share_one_chunk_format() -> None:
    disk = importlib.import_module(NEW + "local_disk_backend")
    codec = importlib.import_module(NEW + "redis.codec")
    chunk = importlib.import_module(NEW + "chunk_format")
    assert disk.read_header is chunk.read_header
    assert codec.decode_value is chunk.decode_value
    assert disk.LocalDiskBackend.__module__ == NEW + "local_disk_backend"
