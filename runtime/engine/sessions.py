"""The engine's sessions: the registry of open sessions plus retention of their KV.

A request with ``SamplingParams.session`` belongs to that session (opened on first use); when
it finishes, its computed KV is held in the radix cache (:mod:`agentlang.runtime.cache.retention`)
until the session's next request is admitted, the session closes, the hold's TTL runs out, or
pages are short. A request that offered tools (``SamplingParams.tool_calls``) without a session
is held the same way under its own id: its continuation is matched by its tokens.

Next-use hints: a request's ``SamplingParams.next_use_s`` (seconds until its continuation, the
client's estimate) or a later :meth:`EngineSessions.hint` sets when its hold is expected back,
which orders releases under pressure (furthest first); without one the session's observed
pauses do. Closing a session (or its timeout) marks its history past the first prompt dead.

TTL rule: ``min(session timeout, hold_s)`` (``EngineConfig.session_hold_s``, default 30 s).
Holding costs other requests nothing while pages are free, and once they are short the
scheduler releases holds before any request waits or is preempted; so the TTL only bounds
what a client that never returns keeps (and the cap, ``EngineConfig.session_max_fraction`` of
the pool, default 0.8, what all of them keep together).

Caller threads: :meth:`open`, :meth:`close`, :meth:`turn_prompt`. The stepping thread:
:meth:`finished` (from the output processor) and :meth:`tick` (every step).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from typing import NamedTuple

from agentlang.runtime.engine.snapshot import namespace_label
from agentlang.runtime.request.request import RequestGroup
from agentlang.runtime.sampling.fields import bound
from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.scheduler.scheduler import Scheduler
from agentlang.runtime.session.registry import SessionRegistry
from agentlang.runtime.session.session import SessionError, TurnParams

REAP_EVERY_S = 1.0


class SessionRow(NamedTuple):
    """One open session as the dashboard and ``/metrics`` show it."""

    id: str
    salt: str | None           # short hash of its cache_salt (None: no salt)
    turns: int
    held_pages: int            # pages on the path its hold keeps (0: nothing held)
    hold_expires_s: float | None
    idle_s: float

    def as_dict(self) -> dict:
        return self._asdict()


class EngineSessions:
    """``namespace(salt)`` is the cache namespace of a ``cache_salt``; ``abort(rid)`` aborts
    a request (any thread); ``lock`` is the engine's (re-entrant) step lock."""

    def __init__(self, registry: SessionRegistry, scheduler: Scheduler,
                 namespace: Callable[[str | None], tuple], abort: Callable[[str], None],
                 hold_s: float, bos_id: int | None, lock: AbstractContextManager):
        self.registry = registry
        self.lock = lock                     # the step lock (re-entrant): rows() reads holds
        self.scheduler = scheduler
        self.namespace = namespace
        self.abort = abort
        self.hold_s = hold_s
        self.bos_id = bos_id
        self._next_reap = 0.0

    # ---- caller threads ------------------------------------------------------------------
    def open(self, session_id: str | None = None, capacity_of_str_len: int | None = None,
             timeout: float | None = None, cache_salt: str | None = None) -> str:
        """Open a session (SGLang's ``/open_session``); returns its id."""
        return self.registry.open(self.namespace(cache_salt), session_id, capacity_of_str_len,
                                  timeout).id

    def ensure(self, session_id: str, cache_salt: str | None = None) -> str:
        """Open ``session_id`` with the defaults unless it is open; ``SessionError`` (429) at
        the limit of open sessions."""
        return self.registry.ensure(self.namespace(cache_salt), session_id).id

    def close(self, session_id: str, cache_salt: str | None = None) -> bool:
        """Close a session: its running turns are aborted and its hold released. Returns
        whether it was open."""
        ns = self.namespace(cache_salt)
        s = self.registry.close(ns, session_id)
        if s is None:
            return False
        with self.registry.lock:
            running = [t.rid for t in s.turns.values() if not t.finished]
        for rid in running:
            self.abort(rid)
        with self.lock:                      # between steps: released when close returns
            self._forget(s)
        return True

    def hint(self, session_id: str, next_use_s: float, cache_salt: str | None = None) -> int:
        """Session ``session_id`` will send its next turn in about ``next_use_s`` seconds
        (a next-use hint, e.g. the tool its last turn called is running): its hold moves in
        the release order (``cache.retention``), or, while a turn runs and nothing is held,
        the hint applies to the hold that turn's end takes. Returns the pages held now.
        ``ValueError`` naming ``next_use_s`` out of range; ``SessionError`` (404) naming
        ``session_id`` for a session that is not open."""
        bound("next_use_s").check("next_use_s", next_use_s)
        ns = self.namespace(cache_salt)
        s = self.registry.get(ns, session_id, field="session_id")
        with self.lock:
            h = self.scheduler.retention.rehint((ns, session_id), time.monotonic(),
                                                float(next_use_s))
            if h is None:
                s.next_use_s = float(next_use_s)
            return 0 if h is None else h.pages

    def turn_prompt(self, turn: TurnParams, new_ids: list[int], max_tokens: int, rid: str,
                    cache_salt: str | None = None) -> list[int]:
        """The prompt of turn ``rid`` of session ``turn.id`` (SGLang's ``session_params``):
        registered as running; the request must then be submitted with ``session=turn.id``.
        ``SessionError`` naming the field, with nothing changed."""
        s = self.registry.get(self.namespace(cache_salt), turn.id)
        with self.registry.lock:
            ids, removed = s.assemble(turn, new_ids, max_tokens, rid, self.bos_id)
            s.last_active = time.monotonic()
        for r in removed:
            self.abort(r)
        return ids

    def check(self, params: SamplingParams, prompt_len: int) -> None:
        """What submitting a request with ``params.session`` would refuse (too many sessions,
        over capacity), checked now: a server answers it before its stream starts."""
        if params.session is not None:
            self.registry.join(self.namespace(params.cache_salt), params.session, prompt_len,
                               params.max_tokens)

    def forget_turn(self, session_id: str, rid: str, cache_salt: str | None = None) -> None:
        """A turn from :meth:`turn_prompt` that was never submitted (its request was refused)."""
        try:
            s = self.registry.get(self.namespace(cache_salt), session_id)
        except SessionError:
            return
        with self.registry.lock:
            s.drop(rid)

    # ---- the stepping thread -------------------------------------------------------------
    def finished(self, group: RequestGroup) -> None:
        """Record the finished turn in its session and hold its KV (see the module doc)."""
        req = min(group.children, key=lambda c: c.index)
        now = time.monotonic()
        ttl, gap = self.hold_s, group.params.next_use_s
        if group.session is not None:
            key: Hashable = group.session
            s = self.registry.find(*group.session)
            if s is not None:
                with self.registry.lock:
                    if group.error is None:
                        s.finish(group.rid, req.output_ids, now)
                    else:
                        s.drop(group.rid)
                    gap, s.next_use_s = (gap if gap is not None else s.next_use_s), None
                ttl = min(ttl, s.timeout) if s.timeout is not None else ttl
            else:
                return                       # closed while the turn ran: nothing to keep
        elif group.params.tool_calls is not None:
            key = ("call", group.rid)
        else:
            return
        if group.error is None and req.num_computed > 0:
            self.scheduler.retain(req, key, now, ttl, gap)

    def tick(self, now: float | None = None) -> None:
        """Release expired holds; close sessions idle past their timeout (once a second)."""
        now = time.monotonic() if now is None else now
        self.scheduler.retention.expire(now)
        if now < self._next_reap:
            return
        self._next_reap = now + REAP_EVERY_S
        for s in self.registry.reap(now):
            self._forget(s)

    def rows(self, now: float | None = None) -> list[SessionRow]:
        """The open sessions and what each holds (taken under the step lock)."""
        now = time.monotonic() if now is None else now
        out = []
        with self.lock:
            sessions = self.registry.sessions()
            holds = {k: self.scheduler.retention.held(k) for k in
                     ((s.namespace, s.id) for s in sessions)}
        for s in sessions:
            h = holds[(s.namespace, s.id)]
            salt = namespace_label(s.namespace).get("salt")     # a short hash, never the salt
            out.append(SessionRow(s.id, salt, len(s.turns), 0 if h is None else h.pages,
                                  None if h is None else max(0.0, h.expires - now),
                                  now - s.last_active))
        return out

    def _forget(self, s) -> None:
        """Session ``s`` closed or timed out: its hold goes and its history past the first
        prompt is dead (``Retention.forget``); the live-program limit learns its length."""
        key = (s.namespace, s.id)
        self.scheduler.live.ended(key)
        self.scheduler.retention.forget(key, s.first_prompt)
