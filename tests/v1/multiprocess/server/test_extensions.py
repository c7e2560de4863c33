"""Server extensions: found by entry point, a broken one is logged and left out."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator, Sequence
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from lmcache.v1.multiprocess.server import extensions
from lmcache.v1.multiprocess.server.extensions import (
    SERVER_EXTENSION_ENTRY_POINT_GROUP,
    add_extension_arguments,
    check_extension_settings,
    extension_http_routers,
    server_extensions,
)


class _Extension:
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--fake-feature", default="off")

    def check(self, args: argparse.Namespace) -> list[str]:
        if args.fake_feature == "refuse":
            raise ValueError("--fake-feature refuse is refused")
        return [] if args.fake_feature == "off" else [f"--fake-feature {args.fake_feature}"]

    def http_routers(self) -> Sequence[Any]:
        return ["router"]


FAKE = _Extension()


@pytest.fixture
def fake_entry_points(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    points = [
        EntryPoint("fake", f"{__name__}:FAKE", SERVER_EXTENSION_ENTRY_POINT_GROUP),
        EntryPoint("broken", "no_such_module_anywhere:X", SERVER_EXTENSION_ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(extensions, "entry_points", lambda group: points)
    server_extensions.cache_clear()
    yield
    server_extensions.cache_clear()


def test_a_broken_extension_is_logged_and_left_out(
    fake_entry_points: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=extensions.__name__):
        loaded = server_extensions()
    assert loaded == (FAKE,)
    (record,) = caplog.records
    assert "server extension 'broken'" in record.getMessage()
    assert "ModuleNotFoundError" in record.getMessage()


def test_flags_checks_and_routes_reach_the_server(
    fake_entry_points: None, caplog: pytest.LogCaptureFixture
) -> None:
    parser = argparse.ArgumentParser()
    add_extension_arguments(parser)
    with caplog.at_level(logging.WARNING, logger=extensions.__name__):
        check_extension_settings(parser.parse_args(["--fake-feature", "on"]))
    assert any("ignored, this server does not implement it: --fake-feature on" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    with pytest.raises(ValueError, match="refused"):
        check_extension_settings(parser.parse_args(["--fake-feature", "refuse"]))
    assert extension_http_routers() == ["router"]


def test_lmcache_core_publishes_upstreams_settings_as_an_extension() -> None:
    server_extensions.cache_clear()
    names = {type(e).__name__ for e in server_extensions()}
    assert "UpstreamServerSettings" in names
