"""The turn-running spine: the worker, one turn's execution and state, the journal, the
partition's watermark and queues, group commit, and parked turns."""
