"""CreateAcls, DescribeAcls and DeleteAcls: Kafka admin clients manage the broker's ACLs (the same
``__security/acls`` as ``pylog acls``).

Authorized like Kafka's: DescribeAcls needs DESCRIBE on the cluster, CreateAcls and DeleteAcls ALTER on the
cluster (:mod:`pylog.broker.authorize`). A broker that authenticates nobody has no authorizer, and answers
SECURITY_DISABLED (54), as Kafka's broker without ``authorizer.class.name`` does.

Filters (DescribeAcls, DeleteAcls) are Kafka's ``AclBindingFilter``: ANY (1) matches every value of a code
field, a null string every value of a string field; the pattern type MATCH (2) selects the ACLs that apply to
the named resource (its literal name, the literal ``*``, and the prefixes of the name).

Thread-safety: handlers run in the event loop; file changes go through :class:`~pylog.broker.acls.AclStore`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from pylog.broker.acls import OPERATIONS, PATTERN_TYPES, PERMISSIONS, RESOURCE_TYPES, Acl, AclStore
from pylog.broker.protocol import ErrorCode, Request
from pylog.errors import ConfigError

if TYPE_CHECKING:
    from pylog.broker.context import Context

__all__ = ["acl_handlers"]

_ANY: Final = 1
_MATCH: Final = 2
_NAMES: Final = {
    "operation": {v: k for k, v in OPERATIONS.items()},
    "permission": {v: k for k, v in PERMISSIONS.items()},
    "resource_type": {v: k for k, v in RESOURCE_TYPES.items()},
    "pattern_type": {v: k for k, v in PATTERN_TYPES.items()},
}
Handler = Callable[["Context", Request], Awaitable[dict[str, Any] | None]]


def acl_handlers(store: AclStore, enabled: bool) -> dict[int, Handler]:
    """The three handlers over ``store``; ``enabled``: the broker authorizes requests."""

    async def describe_acls(ctx: Context, request: Request) -> dict[str, Any]:
        if not enabled:
            return {
                "throttle_time": 0,
                "error_code": ErrorCode.security_disabled,
                "error_message": None,
                "resources": [],
            }
        found = [a for a in await ctx.run(store.acls) if _matches(a, request.body)]
        by_resource: dict[tuple[str, str, str], list[Acl]] = {}
        for acl in sorted(found):
            by_resource.setdefault((acl.resource_type, acl.name, acl.pattern_type), []).append(acl)
        resources = [
            {
                "resource_type": RESOURCE_TYPES[rtype],
                "resource_name": name,
                "pattern_type": PATTERN_TYPES[pattern],
                "acls": [_description(a) for a in acls],
            }
            for (rtype, name, pattern), acls in by_resource.items()
        ]
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "error_message": None,
            "resources": resources,
        }

    async def create_acls(ctx: Context, request: Request) -> dict[str, Any]:
        results: list[dict[str, Any]] = []
        valid: list[Acl] = []
        for creation in request.body.creations:
            if not enabled:
                results.append({"error_code": ErrorCode.security_disabled, "error_message": "no authorizer"})
                continue
            try:
                valid.append(_acl(creation))
                results.append({"error_code": ErrorCode.none, "error_message": None})
            except (ConfigError, KeyError) as exc:
                results.append({"error_code": ErrorCode.invalid_request, "error_message": str(exc)})
        if valid:
            await ctx.run(store.add, valid)
        return {"throttle_time": 0, "results": results}

    async def delete_acls(ctx: Context, request: Request) -> dict[str, Any]:
        results: list[dict[str, Any]] = []
        for f in request.body.filters:
            if not enabled:
                results.append(
                    {"error_code": ErrorCode.security_disabled, "error_message": None, "matching_acls": []}
                )
                continue
            matching = [a for a in await ctx.run(store.acls) if _matches(a, f)]
            gone = await ctx.run(store.remove, matching)
            results.append(
                {
                    "error_code": ErrorCode.none,
                    "error_message": None,
                    "matching_acls": [
                        {
                            "error_code": ErrorCode.none,
                            "error_message": None,
                            "resource_type": RESOURCE_TYPES[a.resource_type],
                            "resource_name": a.name,
                            "pattern_type": PATTERN_TYPES[a.pattern_type],
                            **_description(a),
                        }
                        for a in gone
                    ],
                }
            )
        return {"throttle_time": 0, "filter_results": results}

    return {29: describe_acls, 30: create_acls, 31: delete_acls}


def _acl(c: Any) -> Acl:
    return Acl(
        principal=str(c.principal),
        host=str(c.host),
        operation=_NAMES["operation"][int(c.operation)],
        permission=_NAMES["permission"][int(c.permission_type)],
        resource_type=_NAMES["resource_type"][int(c.resource_type)],
        pattern_type=_NAMES["pattern_type"][int(getattr(c, "resource_pattern_type", 3))],
        name=str(c.resource_name),
    )


def _description(a: Acl) -> dict[str, Any]:
    return {
        "principal": a.principal,
        "host": a.host,
        "operation": OPERATIONS[a.operation],
        "permission_type": PERMISSIONS[a.permission],
    }


def _matches(a: Acl, f: Any) -> bool:
    """Whether ``a`` passes Kafka's AclBindingFilter ``f`` (DescribeAcls' request, a DeleteAcls filter)."""
    for field, code in (
        ("resource_type", int(f.resource_type_filter)),
        ("operation", int(f.operation)),
        ("permission", int(f.permission_type)),
    ):
        if code != _ANY and _NAMES[field].get(code) != getattr(a, field):
            return False
    if f.principal_filter is not None and f.principal_filter != a.principal:
        return False
    if f.host_filter is not None and f.host_filter != a.host:
        return False
    pattern = int(getattr(f, "pattern_type_filter", 3))
    name = f.resource_name_filter
    if pattern == _MATCH:
        return name is None or a.matches(a.resource_type, name)
    if pattern != _ANY and _NAMES["pattern_type"].get(pattern) != a.pattern_type:
        return False
    return name is None or name == a.name
