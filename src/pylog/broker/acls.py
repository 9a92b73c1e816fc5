"""Access control lists of the broker (``pylog acls``, Kafka's ``kafka-acls``): who may do what to which
resource, kept in ``<root>/__security/acls``, and the decision rule (Kafka's ``StandardAuthorizer``).

An ACL is (principal, host, operation, permission, resource type, pattern type, resource name), Kafka's
names: principal ``User:NAME`` or ``User:*``; host an IP address or ``*``; operation READ, WRITE, CREATE,
DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE or ALL;
permission ALLOW or DENY; resource type TOPIC, GROUP, CLUSTER (named ``kafka-cluster``) or TRANSACTIONAL_ID;
pattern LITERAL (the name, or ``*`` for every name) or PREFIXED (every name starting with it).

The decision for (principal, host, operation, resource), as Kafka's:

1. a super user is allowed everything;
2. the ACLs that apply are those whose resource type is the resource's, whose pattern matches its name, whose
   principal is the principal or ``User:*`` and whose host is the client's address or ``*``;
3. any DENY among them for the operation or ALL: denied (deny wins);
4. any ALLOW for the operation, for ALL, or for an operation that implies it: allowed. READ, WRITE, DELETE
   and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS;
5. otherwise denied (Kafka's ``allow.everyone.if.no.acl.found=false``).

File (owner of the format; mirrored in ``docs/format.md``), written as :mod:`pylog.broker.securefile` says
(mode 0600, two-phase, under ``__security/.lock``):

| part | bytes | content |
|---|---|---|
| header | 1 line | ``b"pylog-acls 1 <crc32c of the body, 8 lowercase hex digits>\\n"`` |
| body | rest | UTF-8 JSON object ``{"acls": [ACL, ...]}``, sorted |

Each ACL is ``{"principal", "host", "operation", "permission", "resource_type", "pattern_type", "name"}``, the
values Kafka's names as above. A file that does not check is a :class:`~pylog.errors.ConfigError`: the
broker then denies every request but a super user's.

Thread-safety: :class:`AclStore` and :class:`Authorizer` are thread-safe.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Final

from pylog.broker.securefile import Watched, locked, read_private, security_dir, write_private
from pylog.errors import ConfigError
from pylog.framing import frame, unframe

__all__ = [
    "CLUSTER_NAME",
    "OPERATIONS",
    "PATTERN_TYPES",
    "PERMISSIONS",
    "RESOURCE_TYPES",
    "Acl",
    "AclStore",
    "Authorizer",
]

# Kafka's codes (AclOperation, AclPermissionType, ResourceType, PatternType), used by CreateAcls/DescribeAcls
OPERATIONS: Final = {
    "ALL": 2,
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DELETE": 6,
    "ALTER": 7,
    "DESCRIBE": 8,
    "CLUSTER_ACTION": 9,
    "DESCRIBE_CONFIGS": 10,
    "ALTER_CONFIGS": 11,
    "IDEMPOTENT_WRITE": 12,
}
PERMISSIONS: Final = {"DENY": 2, "ALLOW": 3}
RESOURCE_TYPES: Final = {"TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5}
PATTERN_TYPES: Final = {"LITERAL": 3, "PREFIXED": 4}
CLUSTER_NAME: Final = "kafka-cluster"
ACLS_FILE: Final = "acls"
_MAGIC: Final = b"pylog-acls"
_FORMAT: Final = 1
_IMPLIED: Final = {  # an ALLOW of the key allows these too
    "READ": ("DESCRIBE",),
    "WRITE": ("DESCRIBE",),
    "DELETE": ("DESCRIBE",),
    "ALTER": ("DESCRIBE",),
    "ALTER_CONFIGS": ("DESCRIBE_CONFIGS",),
}


@dataclass(frozen=True, order=True, slots=True)
class Acl:
    principal: str
    host: str
    operation: str
    permission: str
    resource_type: str
    pattern_type: str
    name: str

    def __post_init__(self) -> None:
        for value, known, what in (
            (self.operation, OPERATIONS, "operation"),
            (self.permission, PERMISSIONS, "permission"),
            (self.resource_type, RESOURCE_TYPES, "resource type"),
            (self.pattern_type, PATTERN_TYPES, "pattern type"),
        ):
            if value not in known:
                raise ConfigError(f"unknown ACL {what} {value!r} (known: {', '.join(known)})")
        kind, sep, name = self.principal.partition(":")
        if kind != "User" or not sep or not name:
            raise ConfigError(f"an ACL principal is User:NAME or User:*, got {self.principal!r}")
        if not self.host or not self.name:
            raise ConfigError("an ACL needs a host ('*': any) and a resource name")
        if self.resource_type == "CLUSTER" and (self.name != CLUSTER_NAME or self.pattern_type != "LITERAL"):
            raise ConfigError(f"the cluster resource is the literal {CLUSTER_NAME!r}")

    def matches(self, resource_type: str, name: str) -> bool:
        if resource_type != self.resource_type:
            return False
        if self.pattern_type == "PREFIXED":
            return name.startswith(self.name)
        return self.name in ("*", name)

    def describe(self) -> str:
        """Kafka's wording: ``User:alice has ALLOW permission for operations: READ from hosts: *`` on a
        resource ``TOPIC:LITERAL:events``."""
        return (
            f"{self.resource_type}:{self.pattern_type}:{self.name} {self.principal} {self.permission} "
            f"{self.operation} from {self.host}"
        )


class AclStore:
    """The ACLs of the log directory ``root``: :meth:`acls` sees changes of other processes at its next call."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(security_dir(root), ACLS_FILE)
        self._watched = Watched(self.path, _load)

    def acls(self) -> frozenset[Acl]:
        return self._watched.get()

    def add(self, acls: Iterable[Acl]) -> list[Acl]:
        """Add ``acls``; returns those that were not there already."""
        wanted = list(acls)
        with locked(security_dir(self.root, create=True)):
            current = _load(self.path)
            new = [a for a in dict.fromkeys(wanted) if a not in current]
            if new:
                write_private(self.path, _dump(current | set(new)))
        return new

    def remove(self, acls: Iterable[Acl]) -> list[Acl]:
        """Remove ``acls``; returns those that were there."""
        directory = security_dir(self.root)
        if not os.path.isdir(directory):
            return []
        wanted = set(acls)
        with locked(directory):
            current = _load(self.path)
            gone = sorted(current & wanted)
            if gone:
                write_private(self.path, _dump(current - wanted))
        return gone


class Authorizer:
    """Kafka's decision rule (see the module docstring) over an :class:`AclStore`."""

    def __init__(self, store: AclStore, super_users: frozenset[str] = frozenset()) -> None:
        self.store = store
        self.super_users = super_users

    def allowed(self, principal: str, host: str, operation: str, resource_type: str, name: str) -> bool:
        if principal in self.super_users:
            return True
        acls = [a for a in self._applying(principal, host) if a.matches(resource_type, name)]
        if any(a.permission == "DENY" and a.operation in (operation, "ALL") for a in acls):
            return False
        return any(
            a.permission == "ALLOW"
            and (a.operation in (operation, "ALL") or operation in _IMPLIED.get(a.operation, ()))
            for a in acls
        )

    def allowed_any(self, principal: str, host: str, operation: str, resource_type: str) -> bool:
        """Whether some resource of ``resource_type`` allows ``operation`` (Kafka's
        ``authorizeByResourceType``: an ALLOW not cancelled by a DENY of the same pattern or of ``*``)."""
        if principal in self.super_users:
            return True
        acls = [a for a in self._applying(principal, host) if a.resource_type == resource_type]
        denied = {
            (a.pattern_type, a.name)
            for a in acls
            if a.permission == "DENY" and a.operation in (operation, "ALL")
        }
        if ("LITERAL", "*") in denied:
            return False
        return any(
            a.permission == "ALLOW"
            and (a.operation in (operation, "ALL") or operation in _IMPLIED.get(a.operation, ()))
            and (a.pattern_type, a.name) not in denied
            for a in acls
        )

    def _applying(self, principal: str, host: str) -> list[Acl]:
        try:
            acls = self.store.acls()
        except ConfigError:
            return []  # a damaged file allows nothing (the error is logged by the caller's refusal)
        return [a for a in acls if a.principal in (principal, "User:*") and a.host in (host, "*")]


def _load(path: str) -> frozenset[Acl]:
    raw = read_private(path)
    if raw is None:
        return frozenset()
    try:
        data = json.loads(unframe(raw, _MAGIC, _FORMAT, f"ACL file {path}"))
        return frozenset(Acl(**entry) for entry in data["acls"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path} does not check ({exc}): restore it from a backup, or delete it and add the ACLs again"
        ) from exc


def _dump(acls: Iterable[Acl]) -> bytes:
    body = json.dumps({"acls": [asdict(a) for a in sorted(acls)]}, sort_keys=True)
    return frame(_MAGIC, _FORMAT, body.encode())
