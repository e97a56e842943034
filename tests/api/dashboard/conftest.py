"""The dashboard's JSON endpoints and sign-in session: the API over uvicorn on SQLite, built
with the helpers of tests/api."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.conftest import Server, _serve, _settings


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(_settings(tmp_path_factory.mktemp("dprc-dashboard"), None))
