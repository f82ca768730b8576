"""The wire (floor 2): what our records look like on Kafka, and nothing that sends them.

- ``serde``: the Avro and JSON codecs of ``schemas/``: turn requests, results, journal
  entries.
- ``fingerprint``: a step input's hash, which replay compares with the recorded one.
- ``journal_keys``: the journal topic's keys (``turn_id/<step>`` and the other kinds).
- ``avro_writer``: one writer built per schema.
- ``records``: ``OutRecord``, a record ready to produce, and its size check.
- ``events``: the event types and their encoding.
- ``lineage``: which turn called which.
- ``subagents``, ``signals``: the records of a sub-agent call and of a signal.
- ``guard``: the guarded decode path every byte from outside goes through.
- ``caps``: the caps on ids and counts that come from outside.
- ``text``: cutting text to a byte budget.

Imports only the leaves (``errors``, ``_version``, ``redaction``).
"""
