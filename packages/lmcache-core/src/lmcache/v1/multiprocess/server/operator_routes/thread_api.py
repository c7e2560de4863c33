"""``GET /threads``: every live thread of the process with its current stack.

``?name=`` keeps threads whose name contains it (case-insensitive), ``?thread_id=`` the
thread with that ident; a summary line ends the text.
"""

from __future__ import annotations

import sys
import threading
import traceback

from fastapi import APIRouter, Query
from starlette.responses import PlainTextResponse, Response

__all__ = ["router"]

router = APIRouter()


def _describe(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    if frame is None:
        return f"Thread: {thread}\nNo stack trace available\n"
    return f"Thread: {thread}\nStack trace:\n" + "".join(traceback.format_stack(frame))


@router.get("/threads")
async def get_threads(
    name: str | None = Query(None, description="Filter by thread name (substring)"),
    thread_id: int | None = Query(None, description="Filter by thread ident"),
) -> Response:
    """Live threads and their stacks, optionally filtered."""
    chosen = [
        t
        for t in threading.enumerate()
        if (not name or name.lower() in t.name.lower())
        and (thread_id is None or t.ident == thread_id)
    ]
    body = "\n\n".join(_describe(t) for t in chosen)
    summary = f"\n\n=== Thread Summary ===\nTotal threads: {len(chosen)}\n"
    return PlainTextResponse(body + summary)
