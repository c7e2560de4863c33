"""Shared constants of the HTTP frontend's tests."""

from __future__ import annotations

ADMIN_TOKEN = "frontend-admin-token-" + "0123456789abcdef"
