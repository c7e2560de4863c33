"""Import stubs that let SGLang's CPU engine start without its CUDA-only wheels.

SGLang 0.5.23 imports ``sgl_kernel`` (the ``sglang-kernel`` wheel: sm90/sm100 binaries
only) and ``torchvision`` (whose resolution pulls the CUDA torch) at module level on paths
that the CPU engine with ``--attention-backend torch_native`` never calls for a plain
Llama.  Python runs this file at start-up when its folder is on ``PYTHONPATH``, so the
scheduler processes SGLang spawns get the stubs too.

A stubbed attribute is a class for a capitalised name (``isinstance`` checks, base classes,
enum-like members) and otherwise a callable stub: used as a decorator it returns the
function unchanged, called otherwise it returns another stub.  So a kernel call "succeeds"
without doing anything, and every check that uses this environment compares its output
against a run without LMCache instead of trusting the numbers.  A real module, where
installed, wins: the finder only answers for names nothing else on ``sys.path`` provides.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

STUBBED = ("sgl_kernel", "torchvision")


class _Anything:
    """Stands in for any function, class, constant or submodule attribute."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A decorator (``@triton.jit``, ``@sgl_kernel.x``) keeps the function it wraps;
        # a decorator factory (``@triton.jit(...)``) or a kernel call yields another stub.
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Anything(self._name)

    def __getitem__(self, key: Any) -> _Anything:
        return self  # ``kernel[grid](...)``

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stub_attribute(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<stub {self._name}>"

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # ``class X(stub.Base)`` still defines a class.
        return (object,)


class _StubClass(type):
    """Metaclass of stub classes: class attributes (enum members, constants) are stubs."""

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything(f"{cls.__module__}.{cls.__name__}.{attr}")


def _stub_attribute(name: str) -> Any:
    """A class for a capitalised name (callers use those in ``isinstance`` and as bases),
    a do-nothing callable for everything else."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf[:1].isupper():
        return _StubClass(leaf, (), {"__module__": name.rsplit(".", 1)[0]})
    return _Anything(name)


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = _stub_attribute(f"{self.__name__}.{attr}")
        setattr(self, attr, value)  # one identity per name: isinstance stays consistent
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package: its submodules import through the finder too
        module.__version__ = "0.0.0+stub"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in STUBBED:
            return None
        if "." not in fullname and self._real_spec(fullname) is not None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)

    @staticmethod
    def _real_spec(name: str) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            if isinstance(finder, _StubFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, None)
            if spec is not None:
                return spec
        return None


if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
    sys.meta_path.append(_StubFinder())
