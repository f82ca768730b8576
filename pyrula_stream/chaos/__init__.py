"""The chaos harness (floor 9): proof that a worker can die at any instant and nothing is
lost.

``python -m pyrula_stream.chaos --turns N --workers W --kills K`` runs N turns (two model
calls and one side-effect tool call each) through W worker processes, SIGKILLs a random
worker K times and restarts it, then checks from the outside (the read_committed topics,
the model server's call log, the tool's effects file) that no turn was lost or doubled,
no event repeated, no journaled model call was made again and no effect happened twice.
"""
