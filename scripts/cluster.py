"""``make cluster``: the production topology on this machine, on loopback, until Ctrl-C.

PostgreSQL, Redis (with a generated password), two inference services (echo, TCP behind the shared
secret's challenge-response, heartbeating signed records into the Redis registry), two daphne
processes behind nginx, a Celery worker and beat. Prints where everything is and the admin login;
Ctrl-C (or SIGTERM) stops every piece and deletes the cluster's files. docs/deploy.md explains the
topology and how each piece runs under systemd on real hosts.

    .venv/bin/python scripts/cluster.py [--port 8080] [--services 2] [--daphnes 2] [--slots 4]
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.topology import Cluster  # noqa: E402


def _interrupt(signum, frame) -> None:
    """SIGTERM (systemd, kill) ends the wait like Ctrl-C does, so the cleanup always runs."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/cluster.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8080, help="nginx's loopback port (default 8080)")
    parser.add_argument("--services", type=int, default=2, help="inference services (echo engine)")
    parser.add_argument("--daphnes", type=int, default=2, help="daphne processes behind nginx")
    parser.add_argument("--slots", type=int, default=4, help="slots per inference service")
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, _interrupt)
    print("starting the cluster (PostgreSQL, Redis, services, daphne, nginx, Celery) ...", flush=True)
    try:
        with Cluster(services=args.services, daphnes=args.daphnes, slots=args.slots, nginx_port=args.port) as cluster:
            login = cluster.manage("bootstrap", "--url", f"{cluster.nginx.url}/")
            print(f"\nParley is up at {cluster.nginx.url}/  (console: {cluster.nginx.url}/ops/console/)")
            print(login.strip())
            print(f"  PostgreSQL  {cluster.database_url}\n  Redis       {cluster.redis_url}  (password included)")
            for slot in cluster.service_slots:
                print(
                    f"  {slot.service_id}       tcp://127.0.0.1:{slot.port}  metrics http://127.0.0.1:{slot.metrics_port}/metrics"
                )
            for url in cluster.daphne_urls:
                print(f"  daphne      {url}")
            print(f"  logs        {cluster.var_dir / 'logs'}\nCtrl-C stops everything.", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopped: every process ended and the cluster's files were removed.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
