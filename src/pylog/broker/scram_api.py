"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): Kafka admin clients manage the
broker's SCRAM users (the same ``__security/users`` as ``pylog users``).

An upsertion carries the salt, the iteration count and SaltedPassword (computed by the client), never the
password: the broker keeps StoredKey and ServerKey derived from it. Iterations outside 4096-16384 are
UNACCEPTABLE_CREDENTIAL (93), as Kafka's; a user named twice in one request DUPLICATE_RESOURCE (92); a
deletion of a credential that does not exist, or a description of a user without SCRAM credentials,
RESOURCE_NOT_FOUND (91). A describe naming no user (null or empty) describes every one. Authorized like Kafka's: DESCRIBE (Describe) or ALTER (Alter) on the cluster.

Thread-safety: handlers run in the event loop; file changes go through the credential store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from pylog.broker.credentials import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    Credential,
    CredentialStore,
    ScramCredential,
    check_user_name,
    scram_from_salted,
)
from pylog.broker.protocol import ErrorCode, Request
from pylog.errors import ConfigError

if TYPE_CHECKING:
    from pylog.broker.context import Context

__all__ = ["scram_handlers"]

_MECHANISMS: Final = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
_CODES: Final = {v: k for k, v in _MECHANISMS.items()}
Handler = Callable[["Context", Request], Awaitable[dict[str, Any] | None]]


def scram_handlers(store: CredentialStore) -> dict[int, Handler]:
    async def describe(ctx: Context, request: Request) -> dict[str, Any]:
        users = await ctx.run(store.users)
        asked = [str(u.name) for u in request.body.users or ()] or None  # null or empty: every user
        results = []
        for name in sorted(users) if asked is None else asked:
            mechanisms = [m for m in users.get(name, []) if m in _CODES]
            if asked is not None and asked.count(name) > 1:
                results.append(_described(name, ErrorCode.duplicate_resource, "named more than once"))
            elif not mechanisms:
                if asked is not None:
                    results.append(_described(name, ErrorCode.resource_not_found, "no SCRAM credentials"))
            else:
                infos = []
                for m in mechanisms:
                    credential = await ctx.run(store.lookup, name, m)
                    if isinstance(credential, ScramCredential):
                        infos.append({"mechanism": _CODES[m], "iterations": credential.iterations})
                results.append({**_described(name, ErrorCode.none, None), "credential_infos": infos})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "results": results}

    async def alter(ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        refused: dict[str, tuple[ErrorCode, str]] = {}
        seen: set[tuple[str, str]] = set()
        deletions: list[tuple[str, str]] = []
        upsertions: dict[tuple[str, str], Credential] = {}
        order: list[str] = []
        for item in (*body.deletions, *body.upsertions):
            name = str(item.name)
            if name not in order:
                order.append(name)
            mechanism = _MECHANISMS.get(int(item.mechanism))
            if mechanism is None:
                refused[name] = (ErrorCode.unsupported_sasl_mechanism, "unknown SCRAM mechanism")
                continue
            if (name, mechanism) in seen:
                refused[name] = (ErrorCode.duplicate_resource, "a credential altered twice in one request")
            seen.add((name, mechanism))
            try:
                check_user_name(name)
            except ConfigError as exc:
                refused[name] = (ErrorCode.unacceptable_credential, str(exc))
                continue
            if hasattr(item, "salted_password"):
                iterations = int(item.iterations)
                if (
                    not DEFAULT_ITERATIONS <= iterations <= MAX_ITERATIONS
                    or not item.salt
                    or not item.salted_password
                ):
                    refused[name] = (
                        ErrorCode.unacceptable_credential,
                        f"iterations must be {DEFAULT_ITERATIONS}-{MAX_ITERATIONS}, with a salt and a salted password",
                    )
                    continue
                upsertions[(name, mechanism)] = scram_from_salted(
                    mechanism, bytes(item.salted_password), bytes(item.salt), iterations
                )
            else:
                deletions.append((name, mechanism))
        deletions = [d for d in deletions if d[0] not in refused]
        upsertions = {k: v for k, v in upsertions.items() if k[0] not in refused}
        errors = await ctx.run(store.alter, upsertions, deletions) if deletions or upsertions else {}
        results = []
        for name in order:
            if name in refused:
                code, message = refused[name]
                results.append({"user": name, "error_code": code, "error_message": message})
            elif errors.get(name):
                results.append(
                    {"user": name, "error_code": ErrorCode.resource_not_found, "error_message": errors[name]}
                )
            else:
                results.append({"user": name, "error_code": ErrorCode.none, "error_message": None})
        return {"throttle_time": 0, "results": results}

    return {50: describe, 51: alter}


def _described(name: str, code: ErrorCode, message: str | None) -> dict[str, Any]:
    return {"user": name, "error_code": code, "error_message": message, "credential_infos": []}
