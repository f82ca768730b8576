"""The keys of the journal topic: ``turn_id/<step index>`` and the other kinds of key.

A turn's records are keyed ``turn_id/<suffix>``: a step index, or one of the kinds below
(``progress``, ``terminal``, ``park``, ``reply:<child>``, ``signal:<id>``). A few keys
belong to the partition, not to a turn (``cursor/...``, ``idem/...``,
``dead-lettered/...``, ``batch/...``). The journal is compacted by key, so these bytes
are wire: every journal written so far is read back by them.
"""

from __future__ import annotations

# The kinds of journal keys that are not step indices.
PROGRESS = "progress"
TERMINAL = "terminal"
IDEMPOTENCY_PREFIX = "idem/"
PARK = "park"
"""``turn_id/park``: the turn waits (for sub-agent replies or a time); its journal owns it."""
REPLY = "reply:"
"""``turn_id/reply:<child turn id>``: a sub-agent's outcome, journaled with its offset."""
SIGNAL = "signal:"
"""``turn_id/signal:<signal id>``: a signal (or an answer) for the turn, journaled with its
offset; kept until a wait takes it or the turn ends."""
TAKE_SIGNAL_KIND = "take_signal"
"""The kind of the step that takes a signal (its data: the signal's id) or its timeout."""
REPLY_CURSOR_KEY = "cursor/replies"
"""The partition's read position in the agent's replies topic (same partition number)."""
CURSOR_KINDS = ("replies", "signals", "answers")
"""The topics the replies reader follows, each with its own ``cursor/<kind>`` position."""
CURSOR_KEYS = {f"cursor/{kind}": kind for kind in CURSOR_KINDS}
INTAKE_MARK_KEY = "cursor/intake"
"""The partition's intake mark (``runtime/poison.py``): who reads it, from where."""
BATCH_RESULT = "batch:"
"""``turn_id/batch:<custom id>``: a batch call's outcome, journaled with its batch's
tombstone; kept until the turn ends."""
BATCH_PREFIX = "batch/"
"""``batch/<tag>``: a batch of the partition's calls, journaled before it is submitted
(then with the provider's id); tombstoned when its results are journaled."""
DEAD_LETTERED_PREFIX = "dead-lettered/"
"""``dead-lettered/<offset>``: the turns record at that offset went to the DLQ, committed
with its dead letter; kept until the committed input offset passes it, so a record read
again after a crash is not dead-lettered twice."""


def journal_key(turn_id: str, step: int, kind: str = "") -> str:
    """``turn_id/<step>`` for steps, ``turn_id/progress`` and ``turn_id/terminal`` otherwise."""
    if step >= 0:
        return f"{turn_id}/{step}"
    return f"{turn_id}/{kind}"


def parse_journal_key(key: str) -> tuple[str, str]:
    """``(turn_id, suffix)``: the suffix is a step index, ``progress`` or ``terminal``."""
    turn_id, _, suffix = key.rpartition("/")
    return turn_id, suffix


def park_key(turn_id: str) -> str:
    return f"{turn_id}/{PARK}"


def reply_key(parent_turn_id: str, child: str) -> str:
    return f"{parent_turn_id}/{REPLY}{child}"


def signal_key(turn_id: str, signal_id: str) -> str:
    return f"{turn_id}/{SIGNAL}{signal_id}"


def batch_result_key(turn_id: str, custom_id: str) -> str:
    return f"{turn_id}/{BATCH_RESULT}{custom_id}"


def batch_key(tag: str) -> str:
    return f"{BATCH_PREFIX}{tag}"
