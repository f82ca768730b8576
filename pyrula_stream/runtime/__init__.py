"""The worker and what runs it: the consumer group, scheduling, one turn's execution, the
partition's watermark and queues, restore, group commit, and parked turns. The step
kernel it drives (one turn's journal and steps) is ``pyrula_stream.durable``."""
