"""Stores built on the Kafka client for the declarations above it (floor 4): the tool
cache (``cache``) and shared memory (``memory``), each a compacted topic read as a
table. Inside ``kafka/`` because only ``kafka/`` imports the client; on floor 4 because
it implements the protocols that ``tools/`` and ``state/`` declare."""
