"""The step kernel (floor 5): one turn's journal, its replay decisions and its step
recording.

- ``journal``: what a turn has already done (journaled steps, progress, terminal record).
- ``turn``: one running turn, ``durable_step`` and the records it writes.
- ``branch``: a branch's answers from the turn it replays.
- ``steps``: ``DurableSteps``, ``TurnSteps``, ``ModelSteps``: what a step maker needs of
  the running turn (``context/`` takes the turn through them, never as ``TurnRuntime``).
"""
