"""``python -m pyrula_stream.cli``: the ``pyrula-stream`` command."""

from pyrula_stream.cli import main

raise SystemExit(main())
