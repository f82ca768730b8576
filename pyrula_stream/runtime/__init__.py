"""The worker (floor 7) and what runs it: the consumer group, record intake, the hand-over of
partitions, scheduling, one turn's execution, the partition's watermark and queues,
restore, group commit, journal housekeeping, and parked turns. The step kernel it drives
(one turn's journal and steps) is ``pyrula_stream.durable``."""
