"""The path table: every row resolves to its home's very module object, and nothing else
answers for a name outside the table."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import subprocess
import sys
import textwrap

import pytest

from lmcache.compat import paths
from lmcache.compat.paths import ALL_PATHS, UPSTREAM_EXTRAS, AliasFinder, home_of


def _subtree(home: str) -> list[str]:
    """``home`` and, for a package, every module below it."""
    module = importlib.import_module(home)
    names = [home]
    if hasattr(module, "__path__"):
        names += [m.name for m in pkgutil.walk_packages(module.__path__, home + ".")]
    return names


@pytest.mark.parametrize("alias", sorted(ALL_PATHS))
def test_every_row_is_its_home_module(alias: str) -> None:
    home = ALL_PATHS[alias]
    assert importlib.util.find_spec(alias) is not None
    module = importlib.import_module(alias)
    assert module is importlib.import_module(home)
    assert module.__name__ == home
    # the import system's alias spec must not replace the home's own
    assert module.__spec__ is not None and module.__spec__.name == home


@pytest.mark.parametrize("alias", sorted(a for a in ALL_PATHS if ALL_PATHS[a].count(".") > 1))
def test_a_package_row_covers_its_subtree(alias: str) -> None:
    home = ALL_PATHS[alias]
    for name in _subtree(home):
        if name.rsplit(".", 1)[-1] == "__main__":
            continue
        below = alias + name[len(home) :]
        if home_of(below) != name:
            continue  # a longer row sends it elsewhere; that row has its own case
        assert importlib.import_module(below) is importlib.import_module(name), below


def test_monkeypatch_through_an_upstream_path_patches_the_home(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lmcache.compat.upstream_056 import token_hasher

    sentinel = object()
    monkeypatch.setattr("lmcache.v1.multiprocess.token_hasher.TokenHasher", sentinel)
    assert token_hasher.TokenHasher is sentinel


def test_longest_row_wins() -> None:
    table = {"a.b": "x", "a.b.c": "y.z"}
    assert home_of("a.b.c.d", table) == "y.z.d"
    assert home_of("a.b.e", table) == "x.e"
    assert home_of("a", table) is None
    assert home_of("a.bc", table) is None


def test_names_outside_the_table_are_not_answered() -> None:
    finder = AliasFinder()
    assert finder.find_spec("lmcache.v1.multiprocess.server.transport") is None
    assert finder.find_spec("json") is None
    # a row whose home does not exist answers nothing (the import then fails normally)
    assert AliasFinder({"nowhere.alias": "nowhere.home"}).find_spec("nowhere.alias") is None


@pytest.mark.parametrize("product", sorted(UPSTREAM_EXTRAS))
def test_extras_are_added_to_a_product_module_that_never_imports_them(product: str) -> None:
    module = importlib.import_module(product)
    extras = importlib.import_module(UPSTREAM_EXTRAS[product])
    for name in extras.__all__:
        assert getattr(module, name) is getattr(extras, name)
    source = importlib.util.find_spec(product)
    assert source is not None and source.origin is not None
    with open(source.origin) as f:
        text = f.read()
    assert "import lmcache.compat" not in text and "from lmcache.compat" not in text


def test_import_lmcache_installs_one_finder_and_imports_no_compat_home() -> None:
    # A fresh interpreter: the finder is installed once, and no compatibility module is
    # imported until an upstream path is used.
    code = textwrap.dedent(
        """
        import sys
        import lmcache
        from lmcache.compat.paths import AliasFinder, install
        install(); install()
        assert sum(isinstance(f, AliasFinder) for f in sys.meta_path) == 1
        assert not [m for m in sys.modules if m.startswith("lmcache.compat.upstream_056")]
        import lmcache.v1.multiprocess.server_config
        assert not [m for m in sys.modules if m.startswith("lmcache.compat.upstream_056")]
        import lmcache.compat.upstream_056.pin_monitor
        assert "lmcache.compat.upstream_056.pin_monitor" in sys.modules
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_table_module_is_the_one_compat_import_of_lmcache() -> None:
    import lmcache

    source = lmcache.__file__
    assert source is not None
    with open(source) as f:
        text = f.read()
    assert "lmcache.compat import paths" in text
    assert paths.install() in sys.meta_path
