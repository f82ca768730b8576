"""Local servers speaking the model providers' wire formats, live and batched (floor 9,
a face: what tests, the bench and the chaos harness point the official SDKs at).

``OpenAIBatchServer`` (files, batches, chat completions) and ``AnthropicBatchServer``
(message batches, messages) answer every call through one ``Responder``, live or in a
batch, complete batches after a delay you set, can expire a batch or fail chosen calls,
and log every submitted call. In-process: ``with OpenAIBatchServer() as server: ...``;
as a process of its own (the provider outlives the workers a chaos run kills):
``python -m pyrula_stream.testing_servers openai --log calls.jsonl``, whose first line
on stdout is ``PORT <n>``.
"""

from __future__ import annotations

from pyrula_stream.testing_servers.answers import (
    Answer,
    CallError,
    Prompt,
    Responder,
    ScriptedResponder,
    ToolCall,
    echo,
)
from pyrula_stream.testing_servers.anthropic_batch import AnthropicBatchServer
from pyrula_stream.testing_servers.openai_batch import OpenAIBatchServer

__all__ = [
    "Answer",
    "AnthropicBatchServer",
    "CallError",
    "OpenAIBatchServer",
    "Prompt",
    "Responder",
    "ScriptedResponder",
    "ToolCall",
    "echo",
]
