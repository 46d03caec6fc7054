"""The open sessions, bounded, per namespace; safe from any thread.

A session lives in the namespace of the prefix cache it was opened in (model, dtype and the
request's ``cache_salt``): the same id under another salt is another, invisible session.
Limits: at most ``max_sessions`` open (opening one more is refused with 429), a session's
``capacity`` at most the model's context, ``timeout`` in ``(0, MAX_TIMEOUT_S]`` or ``None``.

Two kinds of use: :meth:`open` (SGLang's ``/open_session``: a session whose turns are
assembled from its tree, :mod:`agentlang.runtime.session.session`) and :meth:`ensure` (a
``session_id`` given with a request — OpenAI routes, the DSL — opens the session on first use
with the defaults; only its KV is kept, the client sends the whole history each time).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Hashable

from agentlang.runtime.session.session import Session, SessionError

MAX_TIMEOUT_S = 24 * 3600.0
MAX_ID_CHARS = 256
DEFAULT_MAX_SESSIONS = 1024


def check_session_id(value: object, field: str = "session_id") -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
        raise SessionError(field, f"must be a non-empty string of at most {MAX_ID_CHARS} "
                           f"characters, got {value!r}")
    return value


def check_timeout(value: object, field: str = "timeout") -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 < value <= MAX_TIMEOUT_S:
        raise SessionError(field, f"must be a number of seconds in (0, {MAX_TIMEOUT_S:g}] or "
                           f"null (no timeout), got {value!r}")
    return float(value)


class SessionRegistry:
    def __init__(self, max_context: int, max_sessions: int = DEFAULT_MAX_SESSIONS,
                 default_timeout: float | None = 600.0):
        self.max_context = max_context
        self.max_sessions = max_sessions
        self.default_timeout = check_timeout(default_timeout, "default_timeout")
        self._sessions: dict[tuple[Hashable, str], Session] = {}
        self.lock = threading.Lock()       # guards the sessions and their turns

    def open(self, namespace: Hashable, session_id: str | None = None,
             capacity: int | None = None, timeout: float | None = None) -> Session:
        """Open a session (a fresh id when ``session_id`` is None). ``SessionError`` for an id
        already open in ``namespace``, a bad capacity or timeout, or too many sessions."""
        sid = uuid.uuid4().hex if session_id is None else check_session_id(session_id)
        if capacity is None:
            capacity = self.max_context
        if isinstance(capacity, bool) or not isinstance(capacity, int) or \
                not 1 <= capacity <= self.max_context:
            raise SessionError("capacity_of_str_len", f"must be an integer in [1, "
                               f"{self.max_context}] (tokens; the model's context), got "
                               f"{capacity!r}")
        timeout = check_timeout(timeout) if timeout is not None else self.default_timeout
        with self.lock:
            if (namespace, sid) in self._sessions:
                raise SessionError("session_id", f"session {sid!r} is already open")
            if len(self._sessions) >= self.max_sessions:
                raise SessionError("session_id", f"{self.max_sessions} sessions are open (the "
                                   "server's limit): close one first", status=429)
            s = Session(sid, namespace, capacity, timeout, time.monotonic())
            self._sessions[(namespace, sid)] = s
            return s

    def ensure(self, namespace: Hashable, session_id: str) -> Session:
        """The open session ``session_id`` of ``namespace``, opened with the defaults if none."""
        with self.lock:
            s = self._sessions.get((namespace, session_id))
        return s if s is not None else self._open_racing(namespace, session_id)

    def join(self, namespace: Hashable, session_id: str, prompt_len: int,
             max_tokens: int) -> str:
        """A request of ``prompt_len`` + ``max_tokens`` tokens joins session ``session_id``
        (opened with the defaults if it is not open); ``SessionError`` (413) over its
        capacity. Returns the id."""
        s = self.ensure(namespace, session_id)
        if prompt_len + max_tokens > s.capacity:
            raise SessionError("session", f"{prompt_len} prompt + {max_tokens} new tokens "
                               f"exceed session {s.id!r}'s capacity of {s.capacity} tokens",
                               status=413)
        s.last_active = time.monotonic()
        if s.first_prompt is None:
            s.first_prompt = prompt_len
        return s.id

    def find(self, namespace: Hashable, session_id: str) -> Session | None:
        with self.lock:
            return self._sessions.get((namespace, session_id))

    def get(self, namespace: Hashable, session_id: str, field: str = "session_params.id"
            ) -> Session:
        with self.lock:
            s = self._sessions.get((namespace, session_id))
        if s is None:
            raise SessionError(field, f"no open session {session_id!r} (open it with "
                               "/open_session; closed and timed-out sessions are gone)", 404)
        return s

    def close(self, namespace: Hashable, session_id: str) -> Session | None:
        """Remove the session; returns it (None if it was not open)."""
        with self.lock:
            return self._sessions.pop((namespace, session_id), None)

    def reap(self, now: float) -> list[Session]:
        """Close and return the sessions idle past their timeout."""
        with self.lock:
            gone = [k for k, s in self._sessions.items() if s.idle(now)]
            return [self._sessions.pop(k) for k in gone]

    def sessions(self) -> list[Session]:
        with self.lock:
            return list(self._sessions.values())

    def __len__(self) -> int:
        return len(self._sessions)

    def _open_racing(self, namespace: Hashable, session_id: str) -> Session:
        try:
            return self.open(namespace, session_id)
        except SessionError:
            with self.lock:                 # another thread opened it meanwhile
                s = self._sessions.get((namespace, session_id))
            if s is None:
                raise
            return s
