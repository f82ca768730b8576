"""The evaluators' stream (floor 7): a consumer group of its own that reads an agent's
finished turns and writes their scores exactly once (``runner``), joins deferred outcomes
with business events (``joins``) and keeps those joins' state in ``<agent>.outcomes``
(``state``)."""
