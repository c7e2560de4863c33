"""The public kit for vendor kernels: checks, geometry, KV ops declared once, a loader.

- :mod:`.checks` -- every KV op's argument checks, in the baseline's order and wording, and
  :class:`~.checks.Unsupported` for inputs a native path declines.
- :mod:`.geometry` -- one view-free strided geometry of engine and LMCache buffers for every
  ``EngineKVFormat``; the torch baseline builds its views from the same numbers.
- :mod:`.ops` -- each KV op declared once (signature, checks, geometry, fallback to the
  torch baseline) around a backend's :class:`~.ops.KVKernels`; :func:`~.ops.kv_ops` returns
  callables with the exact ``torch_ops`` signatures for ``DeviceOps.bind_native``.
- :mod:`.native_loader` -- import a native module fail-soft (one warning, then the baseline)
  with a disable variable; :class:`~.native_loader.NativeDeviceOps` wires it into
  ``ensure_native``.
- :mod:`.views` -- :class:`~.views.PagedLayout`, the baseline's canonical torch views of a
  paged KV cache, and :func:`~.views.paged_layout_from_tensors`; :mod:`.runtime` -- the
  selected backend's device runtime module.

Import the submodules directly: this package imports nothing eagerly, because the torch
baseline itself depends on :mod:`.checks` and :mod:`.geometry` while :mod:`.ops` depends on
the baseline.
"""
