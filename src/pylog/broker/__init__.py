"""pylog speaks Kafka: a single-node Kafka broker over a log directory, for unchanged Kafka clients.

``pylog --dir DIR serve`` and :func:`pylog.serve` run it; ``docs/kafka-clients.md`` says what it serves. The
modules, as a request flows::

    broker.py     Broker, serve(): options, the one-broker-per-directory lock, start and stop
    server.py     the asyncio server: framing, bounded request sizes, per-connection order, dispatch
    protocol.py   kio's messages: request headers, versions served, responses built from plain values
    security.py   each connection's principal: TLS, the SASL exchange, what is served before it
    sasl.py       SASL's server side: PLAIN, SCRAM-SHA-256/512
    authorize.py  Kafka's authorization of each API against the ACLs
    acls.py       the ACLs (__security/acls) and Kafka's decision rule
    credentials.py  the users (__security/users): salted SCRAM keys and PLAIN hashes
    securefile.py   how those two files are written (0600, two-phase, locked) and re-read
    meta.py       ApiVersions, Metadata (topic auto-creation)
    produce.py    Produce (acks 0, 1, all)
    idempotence.py  InitProducerId, the sequence checks of idempotent producers
    transactions.py Kafka transactions on pylog's transactional producers
    fetch.py      Fetch (long polling on the doorbell, isolation levels), ListOffsets
    groups.py     the classic consumer group protocol; commits in pylog's group store
    admin.py      CreateTopics, DeleteTopics, DescribeConfigs, groups, cluster; single-node answers
    records.py    Kafka record batch v2 <-> pylog records (the byte table is there)
    waiting.py    the doorbell thread that wakes long-polling fetches
    context.py    what handlers share: the log, options, producers, thread pool

The Kafka protocol codec (kio) and snappy (cramjam) come with the ``broker`` extra: ``pip install
'pylog[broker]'``; importing pylog does not need them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from pylog.errors import ConfigError

if TYPE_CHECKING:
    from pylog.broker.broker import Broker
    from pylog.log import Log

__all__ = ["serve"]


def serve(path_or_log: str | os.PathLike[str] | Log, listen: str = "127.0.0.1:0", **options: Any) -> Broker:
    """Start a Kafka broker over a log directory (a path, opened and closed by the broker, or an open
    :class:`~pylog.Log`, left open) listening on ``listen`` (``HOST:PORT``; port 0 picks a free one), and
    return the running :class:`~pylog.broker.broker.Broker`: give its ``bootstrap_servers`` to Kafka clients,
    ``close()`` it (or use it as a context manager) to stop it.

    ``options``: ``advertise`` (``HOST:PORT`` put in metadata, default the listening address),
    ``auto_create_topics`` (True), ``num_partitions`` (1, for auto-created topics), ``allow_anonymous``
    (False: loopback addresses only unless clients authenticate), ``max_request_bytes`` (100 MiB), ``sasl``
    (``"SCRAM-SHA-512,PLAIN"``), ``tls_cert``, ``tls_key``, ``tls_client_ca`` (PEM files), ``super_users``
    (``"User:admin"``); see ``docs/security.md``. Raises
    :class:`~pylog.errors.LockError` when another broker serves the directory, and
    :class:`~pylog.errors.ConfigError` for bad options or when the ``broker`` extra is not installed."""
    try:
        from pylog.broker import broker  # the broker extra's packages (kio, cramjam) are imported here
    except ImportError as exc:  # pragma: no cover - needs an environment without the extra
        raise ConfigError(f"pylog.serve needs the broker extra ({exc}): pip install 'pylog[broker]'") from exc
    return broker.serve(path_or_log, listen, **options)
