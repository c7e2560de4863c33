"""A storage plugin used by the tests: keeps copies of objects in a dict.

Loaded by name (``storage_test_plugin:DictStoragePlugin``) exactly as a third-party plugin
would be, so it exercises the plugin launcher as well as the conformance suite.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.abstract_backend import (
    AllocatorBackendInterface,
    StoragePluginInterface,
)


class DictStoragePlugin(StoragePluginInterface):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._data: dict[CacheEngineKey, tuple[bytes, MemoryObj]] = {}
        self._pins: dict[CacheEngineKey, int] = {}
        self._lock = threading.Lock()
        self.option = (
            self.config.get_extra_config_value("storage_plugin.dict.option", None)
            if self.config is not None
            else None
        )

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        with self._lock:
            if key not in self._data:
                return False
            if pin:
                self._pins[key] = self._pins.get(key, 0) + 1
            return True

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return False

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future] | None:
        for key, obj in zip(keys, objs):
            with self._lock:
                if key not in self._data:
                    self._data[key] = (bytes(obj.byte_array), obj)
            if on_complete_callback is not None:
                on_complete_callback(key)
        return None

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        with self._lock:
            item = self._data.get(key)
        if item is None:
            return None
        data, template = item
        assert self.local_cpu_backend is not None
        obj = self.local_cpu_backend.allocate(
            template.get_shapes(), template.get_dtypes(), template.get_memory_format()
        )
        if obj is not None:
            obj.byte_array[:] = data
        return obj

    def pin(self, key: CacheEngineKey) -> bool:
        return self.contains(key, pin=True)

    def unpin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            if self._pins.get(key, 0) == 0 or key not in self._data:
                return False
            self._pins[key] -= 1
            return True

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        with self._lock:
            if not force and self._pins.get(key, 0):
                return False
            self._pins.pop(key, None)
            return self._data.pop(key, None) is not None

    def get_allocator_backend(self) -> AllocatorBackendInterface:
        assert self.local_cpu_backend is not None
        return self.local_cpu_backend

    def close(self) -> None:
        self._data.clear()


class BrokenStoragePlugin(StoragePluginInterface):
    def __init__(self, **kwargs: Any) -> None:
        raise RuntimeError("this plugin always fails")
