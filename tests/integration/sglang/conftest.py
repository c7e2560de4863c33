"""Shared fixtures of the connector tests that need a real server but no SGLang."""

from __future__ import annotations

from small_servers import small_server  # noqa: F401 (fixture)
