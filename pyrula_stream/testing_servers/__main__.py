"""Run one local provider server as its own process; the first stdout line is ``PORT <n>``.

``python -m pyrula_stream.testing_servers openai|anthropic [--port 0] [--delay 2]
[--log calls.jsonl] [--responder module:attribute] [--expire-every N] [--fail-every N]``
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from pyrula_stream.testing_servers.answers import Responder, echo, load_responder
from pyrula_stream.testing_servers.anthropic_batch import AnthropicBatchServer
from pyrula_stream.testing_servers.openai_batch import OpenAIBatchServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyrula_stream.testing_servers")
    parser.add_argument("provider", choices=["openai", "anthropic"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds until a batch ends")
    parser.add_argument("--log", default=None, help="call log (JSON lines, appended)")
    parser.add_argument(
        "--responder", default=None, help="module:attribute answering calls (default: echo)"
    )
    parser.add_argument("--expire-every", type=int, default=0, help="every n-th batch expires")
    parser.add_argument("--fail-every", type=int, default=0, help="every n-th call errors")
    args = parser.parse_args(argv)
    responder: Responder = load_responder(args.responder) if args.responder else echo
    server_class = OpenAIBatchServer if args.provider == "openai" else AnthropicBatchServer
    server = server_class(
        responder, delay_s=args.delay, log=args.log, host=args.host, port=args.port
    )
    server.book.expire_every = args.expire_every
    server.book.fail_every = args.fail_every
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.stop).start())
    print(f"PORT {server.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
