"""Old import paths of modules that moved into packages, kept working for one release.

The package root's modules moved into packages named for their floor (``serde`` into
``wire/``, ``history`` into ``state/``, ...). Importing an old path gives the module at its
new home, the same object, with a ``DeprecationWarning`` that names that home. A finder
on ``sys.meta_path`` does it, so the old names need no file each at the package root.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED: dict[str, str] = {
    "pyrula_stream.agent_calls": "pyrula_stream.context.agent_calls",
    "pyrula_stream.agent_tool": "pyrula_stream.agent.as_tool",
    "pyrula_stream.api_keys": "pyrula_stream.access.api_keys",
    "pyrula_stream.approvals": "pyrula_stream.context.approvals",
    "pyrula_stream.avro_writer": "pyrula_stream.wire.avro_writer",
    "pyrula_stream.cache_table": "pyrula_stream.tools.cache_table",
    "pyrula_stream.client_signals": "pyrula_stream.client.signals",
    "pyrula_stream.compaction": "pyrula_stream.context.compaction",
    "pyrula_stream.deadlines": "pyrula_stream.tools.deadlines",
    "pyrula_stream.event_reader": "pyrula_stream.client.event_reader",
    "pyrula_stream.events": "pyrula_stream.wire.events",
    "pyrula_stream.health": "pyrula_stream.runtime.health",
    "pyrula_stream.history": "pyrula_stream.state.history",
    "pyrula_stream.http_guard": "pyrula_stream.access.http_guard",
    "pyrula_stream.kafka.cache_store": "pyrula_stream.kafka.stores.cache",
    "pyrula_stream.kafka.local_broker": "pyrula_stream.kafka.local.broker",
    "pyrula_stream.kafka.local_cluster": "pyrula_stream.kafka.local.cluster",
    "pyrula_stream.kafka.local_registry": "pyrula_stream.kafka.local.registry",
    "pyrula_stream.kafka.memory_store": "pyrula_stream.kafka.stores.memory",
    "pyrula_stream.limits": "pyrula_stream.agent.limits",
    "pyrula_stream.lineage": "pyrula_stream.wire.lineage",
    "pyrula_stream.loop": "pyrula_stream.context.tool_loop",
    "pyrula_stream.mcp.declaration": "pyrula_stream.tools.mcp_servers",
    "pyrula_stream.mcp.serve": "pyrula_stream.integrations.mcp_server",
    "pyrula_stream.memory": "pyrula_stream.state.memory",
    "pyrula_stream.memory_calls": "pyrula_stream.context.memory_calls",
    "pyrula_stream.mesh": "pyrula_stream.runtime.mesh",
    "pyrula_stream.options": "pyrula_stream.runtime.options",
    "pyrula_stream.output": "pyrula_stream.agent.output",
    "pyrula_stream.records": "pyrula_stream.wire.records",
    "pyrula_stream.replay": "pyrula_stream.runtime.replay",
    "pyrula_stream.retry": "pyrula_stream.tools.retry",
    "pyrula_stream.serde": "pyrula_stream.wire.serde",
    "pyrula_stream.signals": "pyrula_stream.wire.signals",
    "pyrula_stream.subagents": "pyrula_stream.wire.subagents",
    "pyrula_stream.supervisor": "pyrula_stream.runtime.supervisor",
    "pyrula_stream.tenants": "pyrula_stream.agent.tenants",
    "pyrula_stream.text": "pyrula_stream.wire.text",
    "pyrula_stream.threads": "pyrula_stream.state.threads",
    "pyrula_stream.tool_cache": "pyrula_stream.tools.cache",
    "pyrula_stream.tool_calls": "pyrula_stream.context.tool_calls",
    "pyrula_stream.tool_schema": "pyrula_stream.tools.schema",
    "pyrula_stream.turn_status": "pyrula_stream.client.turn_status",
    "pyrula_stream.versions": "pyrula_stream.runtime.versions",
    "pyrula_stream.waits": "pyrula_stream.context.waits",
    "pyrula_stream.wire_guard": "pyrula_stream.wire.guard",
}
"""Old dotted path -> the module's home now. Remove a row a release after it was added."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old path to the module at its new home, and warns once per import."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        home = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {home}; the old path goes away in the next release",
            DeprecationWarning,
            stacklevel=_importer_level(),
        )
        return importlib.import_module(home)

    def exec_module(self, module: ModuleType) -> None:
        """The module at its home has run already; nothing more to do."""


def _importer_level() -> int:
    """The ``stacklevel`` that points the warning at the import statement, past the
    frames of the import machinery."""
    frame = sys._getframe(2)
    level = 3
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (importing ``pyrula_stream`` does it)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
