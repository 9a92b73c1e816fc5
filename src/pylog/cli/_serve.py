"""``pylog serve``: a single-node Kafka broker over the log directory, for unchanged Kafka clients.

Prints one line, the address it listens on (``HOST:PORT``), once it accepts connections, so that scripts and
tests can read it; runs until SIGTERM or Ctrl-C (SIGINT), then stops gracefully: requests being handled are
answered, everything acknowledged is written, the log is closed, and the exit status is 0.
See ``docs/kafka-clients.md``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

import pylog
from pylog.cli._common import Parents, described, log_dir

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers

__all__ = ["register"]


_SERVE_HELP = """\
Serve the log directory to unchanged Kafka clients (kafka-python, confluent-kafka, the Java client, ...)
as a single-node Kafka broker listening on --listen (default 127.0.0.1:9092; port 0 picks a free port).
Prints one line, the address clients connect to (HOST:PORT), once it accepts connections; then runs until
Ctrl-C (SIGINT) or SIGTERM, and stops gracefully: requests being handled are answered, everything
acknowledged is written and the log is closed.

On disk: what the clients do (records produced, topics created, groups and their committed offsets), in
the log directory, which is created if it does not exist. Topics clients ask metadata for are created
(with --num-partitions partitions) unless --no-auto-create-topics is given.

Security (see docs/security.md): --tls-cert and --tls-key encrypt connections (clients use SSL or
SASL_SSL); --tls-client-ca requires client certificates signed by that CA (the principal is the
certificate's subject); --sasl SCRAM-SHA-256,SCRAM-SHA-512,PLAIN requires clients to authenticate as a user
of 'pylog users'. When clients authenticate, every request is checked against the ACLs of 'pylog acls'
(no matching ACL: denied) unless the principal is one of --super-users. Without authentication, an address
other than loopback needs --allow-anonymous.

Listening on every interface (0.0.0.0 or [::]), the address printed and given to clients in metadata is the
machine's host name (as Kafka advertises a listener without a host), or 127.0.0.1 if the host name does not
resolve; --advertise HOST:PORT gives the address other machines reach.

Exit status: 0 stopped by Ctrl-C or SIGTERM; 1 the address cannot be listened on, or the log directory
cannot be opened; 2 a usage error."""


def register(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "serve",
        parents=parents.dir_only,
        help="serve the log to Kafka clients (a single-node Kafka broker)",
        **described(_SERVE_HELP),
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:9092",
        help="address to listen on (port 0: any free)",
    )
    p.add_argument("--advertise", metavar="HOST:PORT", help="address given to clients in metadata")
    p.add_argument(
        "--no-auto-create-topics",
        dest="auto_create_topics",
        action="store_false",
        help="do not create topics clients ask metadata for (auto.create.topics.enable=false)",
    )
    p.add_argument(
        "--num-partitions", type=int, default=1, metavar="N", help="partitions of auto-created topics (1)"
    )
    p.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="allow a non-loopback --listen address (no authentication: anyone who reaches it reads and writes)",
    )
    p.add_argument(
        "--sasl",
        metavar="MECH[,MECH...]",
        help="require SASL authentication with these mechanisms (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN)",
    )
    p.add_argument("--tls-cert", metavar="FILE", help="the broker's TLS certificate chain (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
    p.add_argument(
        "--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA (PEM)"
    )
    p.add_argument(
        "--super-users",
        metavar="User:A,User:B",
        help="principals allowed everything, whatever the ACLs say",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=2**31 - 1,
        metavar="N",
        help="connections at once (max.connections)",
    )
    p.add_argument(
        "--max-connections-per-ip",
        type=int,
        default=2**31 - 1,
        metavar="N",
        help="connections at once from one address (max.connections.per.ip)",
    )
    p.add_argument(
        "--connections-max-idle-ms",
        type=int,
        default=600_000,
        metavar="MS",
        help="close a connection idle that long between requests (connections.max.idle.ms, 600000)",
    )
    p.add_argument(
        "--producer-byte-rate",
        type=int,
        metavar="BYTES",
        help="record bytes per second each principal may produce where no 'pylog quotas' quota applies "
        "(producer_byte_rate; unlimited)",
    )
    p.add_argument(
        "--consumer-byte-rate",
        type=int,
        metavar="BYTES",
        help="record bytes per second each principal may fetch where no 'pylog quotas' quota applies "
        "(consumer_byte_rate; unlimited)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=100 << 20,
        metavar="BYTES",
        help="largest request a client may send; a larger one closes its connection unread "
        "(socket.request.max.bytes, 104857600)",
    )
    p.add_argument(
        "--queued-max-request-bytes",
        type=int,
        default=512 << 20,
        metavar="BYTES",
        help="bytes of requests read and not yet answered, all connections together (queued.max.request.bytes)",
    )
    p.add_argument(
        "--request-read-timeout-ms",
        type=int,
        metavar="MS",
        help="close a connection that sends no byte of a request it has begun for that long, giving its share "
        "of --queued-max-request-bytes back (30000, or --connections-max-idle-ms if shorter)",
    )
    p.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (no authentication: keep it on a private address)",
    )
    p.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pylog.serve(
            log_dir(args),  # opened (created if new) and closed by the broker, after the options are checked
            args.listen,
            advertise=args.advertise,
            auto_create_topics=args.auto_create_topics,
            num_partitions=args.num_partitions,
            allow_anonymous=args.allow_anonymous,
            sasl=args.sasl,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca,
            super_users=args.super_users,
            max_connections=args.max_connections,
            max_connections_per_ip=args.max_connections_per_ip,
            connections_max_idle_ms=args.connections_max_idle_ms,
            producer_byte_rate=args.producer_byte_rate,
            consumer_byte_rate=args.consumer_byte_rate,
            metrics=args.metrics,
            queued_max_request_bytes=args.queued_max_request_bytes,
            request_read_timeout_ms=args.request_read_timeout_ms,
            max_request_bytes=args.max_request_bytes,
        ) as broker:
            sys.stdout.write(broker.bootstrap_servers + "\n")
            sys.stdout.flush()
            if broker.host in ("0.0.0.0", "::"):
                sys.stderr.write(
                    f"pylog serve: listening on every interface, port {broker.port}; clients are given "
                    f"{broker.advertised} (--advertise HOST:PORT gives another address)\n"
                )
            while not stop.wait(1.0):
                pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
