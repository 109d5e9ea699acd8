"""``python -m inference serve``: one inference service process, on its unix socket and, when asked,
in a deployment of several (``inference.cluster.membership``: a TCP listener, a registry heartbeat, a
metrics port). The connections themselves are ``inference.transport.server``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from inference.config import ConfigError, InferenceConfig
from inference.log_format import configure_logging


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket", help="unix socket path, in a private directory (default: PARLEY_INFERENCE_URL, else var/run/)"
    )
    parser.add_argument("--engine", help="engine name (default: PARLEY_ENGINE, else echo)")
    parser.add_argument("--slots", type=int, help="slots (default: PARLEY_SLOTS, else 4)")
    parser.add_argument("--tcp", metavar="HOST:PORT", help="also serve TCP here (another host's web tier)")
    parser.add_argument("--advertise", metavar="HOST:PORT", help="the address web hosts dial (default: --tcp)")
    parser.add_argument("--service-id", help="name in the registry (default: PARLEY_SERVICE_ID, else host-pid)")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT")


def run(args: argparse.Namespace) -> int:
    pairs = (("engine", args.engine), ("slots", args.slots), ("service_id", args.service_id))
    overrides = {k: v for k, v in pairs if v is not None}
    try:
        config = InferenceConfig.from_env().with_overrides(**overrides)
    except ConfigError as exc:  # the variable and its value, not a traceback
        print(f"inference service: bad configuration: {exc}", file=sys.stderr, flush=True)
        return 2
    # Imported once the configuration is known to be good: a bad value stops the service at once, not after the
    # seconds torch and the engines take to import.
    from inference.cluster.membership import Membership
    from inference.service import InferenceService
    from inference.transport.server import serve

    socket_path = args.socket or config.socket_path
    configure_logging(json_lines=config.log_json)  # JSON lines in production, key=value extras otherwise

    def progress(fraction: float, stage: str) -> None:
        print(f"warming up {config.engine}: {fraction * 100:5.1f}% {stage}", flush=True)

    async def main() -> None:
        service = InferenceService(config)
        print(f"starting engine {config.engine!r} with {config.slots} slot(s) on {config.device}", flush=True)
        await service.start(progress)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        membership = Membership(
            service,
            config,
            socket_path=socket_path,
            tcp=args.tcp,
            advertise=args.advertise,
            metrics_port=args.metrics_port,
        )
        await serve(service, socket_path, stop, membership)

    asyncio.run(main())
    print("stopped", file=sys.stderr, flush=True)
    return 0
