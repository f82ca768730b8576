"""Comparing agent versions by their scores (floor 8, beside the clients): the statistics
(``stats``), reading ``<agent>.scores`` (``scores``), the report of ``pyrula-stream evals
report`` (``report``) and offline evaluation over recorded turns (``offline``)."""
