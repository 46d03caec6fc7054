"""Server fixtures: one real server subprocess shared by the whole session (see
:mod:`server_harness`), an httpx client and an official ``openai`` client for it."""

from __future__ import annotations

import httpx
import pytest
from server_harness import start_server


@pytest.fixture(scope="session")
def server():
    srv = start_server()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url, api_key="unused", timeout=120, max_retries=0)
