"""Running engine requests for HTTP clients: server-sent events, merged streams, and aborting
on client disconnect.

- :func:`sse` formats one ``data: {json}`` event; :data:`DONE` ends a stream.
- :func:`merge_streams` interleaves several engine streams (a batch of prompts), tagging each
  delta with its stream's position; closing the merged iterator closes (aborts) them all.
- :func:`until_disconnect` awaits a non-streaming generation but cancels it, aborting the engine
  requests, as soon as the client goes away. Streaming responses need no watcher: Starlette
  cancels the response task on disconnect, and the cancellation closes the engine stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from typing import Any, TypeVar

from fastapi import Request

from agentlang.runtime.server.errors import APIError

T = TypeVar("T")
DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def error_event(exc: BaseException) -> str:
    """An in-stream error (the status line was already sent): OpenAI error body as an event."""
    if isinstance(exc, APIError):
        return sse(exc.body())
    if isinstance(exc, ValueError):
        from agentlang.runtime.server.errors import from_value_error

        return sse(from_value_error(exc).body())
    err = APIError(500, f"internal server error: {type(exc).__name__}: {exc}")
    return sse(err.body())


async def merge_streams(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Yield ``(i, item)`` from every stream as items arrive; an error in one stream is
    raised here (the others are closed)."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as s:
            async for item in s:
                yield 0, item
        return
    end = object()
    q: asyncio.Queue[tuple[int, Any, BaseException | object | None]] = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[T]) -> None:
        try:
            async with aclosing(s):
                async for item in s:
                    q.put_nowait((i, item, None))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - forwarded to the consumer
            q.put_nowait((i, None, e))
        finally:
            q.put_nowait((i, None, end))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            i, item, flag = await q.get()
            if flag is end:
                left -= 1
            elif flag is not None:
                raise flag  # type: ignore[misc]
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` (its body already read); raise :class:`ClientDisconnected` after
    cancelling it if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise ClientDisconnected()
        return task.result()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
