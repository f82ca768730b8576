"""``pyrula-stream ui`` (floor 9): a live web view of turns, their timelines and the DLQ.

Needs the ``ui`` extra (``pip install 'pyrula-stream[ui]'``): Starlette and uvicorn.
"""
