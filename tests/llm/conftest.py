"""The model tests' provider servers: each fixture starts a local server that speaks the
provider's wire format (``pyrula_stream/testing_servers/``), and an adapter on its official SDK
pointed at it. Function-scoped: every test gets a fresh server and its own queue."""

from tests.llm.servers.fixtures import (
    anthropic_llm as anthropic_llm,
)
from tests.llm.servers.fixtures import (
    anthropic_server as anthropic_server,
)
from tests.llm.servers.fixtures import (
    openai_llm as openai_llm,
)
from tests.llm.servers.fixtures import (
    openai_server as openai_server,
)
