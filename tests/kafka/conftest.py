"""Fixtures of the Kafka tests: the schema registry, started once for the tests of this
folder that ask for it and stopped when they are done (the plugin's own fixture would
keep its JVM running to the end of the session)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyrula_stream.testing import local_schema_registry


@pytest.fixture(scope="package")
def schema_registry_url() -> Iterator[str]:
    with local_schema_registry() as url:
        yield url
