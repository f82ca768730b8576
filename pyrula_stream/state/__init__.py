"""State that outlives a turn (floor 4): ``threads`` (a conversation's turns),
``history`` (a finished turn's recording) and ``memory`` (``MemoryBackend``, shared
across turns). Their Kafka stores live in ``kafka/stores/``."""
