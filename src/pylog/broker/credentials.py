"""Users of the broker and their credentials: ``<root>/__security/users`` (``pylog users add|list|delete``).

No password is stored: per user and SASL mechanism, what the mechanism's server side needs to check one.

- SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677; Kafka's KIP-84): a random 32-byte ``salt``, the
  ``iterations`` count (4096 by default, Kafka's minimum), ``stored_key`` = H(HMAC(SaltedPassword, "Client
  Key")) and ``server_key`` = HMAC(SaltedPassword, "Server Key"), where SaltedPassword = PBKDF2-HMAC(H,
  password, salt, iterations). A stored key proves a client's proof, and cannot be used to compute one.
- PLAIN: the password arrives in clear (inside TLS, one hopes) and is checked against scrypt(password, salt,
  n, r, p) with a random 16-byte salt (n = 2^14, r = 8, p = 1 by default: about 16 MiB and tens of
  milliseconds per check, run in the broker's thread pool), compared in constant time.

File (owner of the format; mirrored in ``docs/format.md``), written as :mod:`pylog.broker.securefile` says
(mode 0600, two-phase, under ``__security/.lock``):

| part | bytes | content |
|---|---|---|
| header | 1 line | ``b"pylog-users 1 <crc32c of the body, 8 lowercase hex digits>\\n"`` |
| body | rest | UTF-8 JSON object ``{"users": {NAME: {MECHANISM: CREDENTIAL, ...}, ...}}`` |

A SCRAM credential is ``{"salt": B64, "iterations": N, "stored_key": B64, "server_key": B64}``, a PLAIN one
``{"salt": B64, "n": N, "r": R, "p": P, "hash": B64}`` (B64: standard base64). A file whose header, CRC or
JSON does not check is a :class:`~pylog.errors.ConfigError` (the broker then authenticates nobody); another
format version is an :class:`~pylog.errors.UnsupportedFormatError`.

Thread-safety: :class:`CredentialStore` is thread-safe.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from typing import Any, Final

from pylog.broker.securefile import Watched, locked, read_private, security_dir, write_private
from pylog.errors import ConfigError
from pylog.framing import frame, unframe

__all__ = [
    "DEFAULT_ITERATIONS",
    "MECHANISMS",
    "SCRAM_HASHES",
    "CredentialStore",
    "PlainCredential",
    "ScramCredential",
    "check_user_name",
    "plain_credential",
    "scram_credential",
    "scram_from_salted",
    "verify_plain",
]

MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
SCRAM_HASHES: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
DEFAULT_ITERATIONS: Final = 4096  # Kafka's minimum for SCRAM
MAX_ITERATIONS: Final = 16384  # Kafka's maximum
USERS_FILE: Final = "users"
_MAGIC: Final = b"pylog-users"
_FORMAT: Final = 1
_SCRYPT: Final = {"n": 1 << 14, "r": 8, "p": 1}


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass(frozen=True, slots=True)
class PlainCredential:
    salt: bytes
    n: int
    r: int
    p: int
    hash: bytes


Credential = ScramCredential | PlainCredential


def scram_credential(
    mechanism: str, password: str, salt: bytes | None = None, iterations: int = DEFAULT_ITERATIONS
) -> ScramCredential:
    """The stored form of ``password`` for SCRAM ``mechanism`` (RFC 5802 section 3)."""
    name = SCRAM_HASHES[mechanism]
    if type(iterations) is not int or not DEFAULT_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ConfigError(
            f"SCRAM iterations must be {DEFAULT_ITERATIONS}-{MAX_ITERATIONS}, got {iterations!r}"
        )
    salt = secrets.token_bytes(32) if salt is None else salt
    salted = hashlib.pbkdf2_hmac(name, password.encode(), salt, iterations)
    return scram_from_salted(mechanism, salted, salt, iterations)


def scram_from_salted(
    mechanism: str, salted_password: bytes, salt: bytes, iterations: int
) -> ScramCredential:
    """The stored form from SaltedPassword (what Kafka's AlterUserScramCredentials sends, KIP-554)."""
    name = SCRAM_HASHES[mechanism]
    client_key = hmac.digest(salted_password, b"Client Key", name)
    server_key = hmac.digest(salted_password, b"Server Key", name)
    return ScramCredential(salt, iterations, hashlib.new(name, client_key).digest(), server_key)


def plain_credential(password: str, salt: bytes | None = None) -> PlainCredential:
    """The stored form of ``password`` for PLAIN: a salted scrypt hash."""
    salt = secrets.token_bytes(16) if salt is None else salt
    n, r, p = _SCRYPT["n"], _SCRYPT["r"], _SCRYPT["p"]
    return PlainCredential(salt, n, r, p, _scrypt(password.encode(), salt, n, r, p))


def verify_plain(credential: PlainCredential, password: bytes) -> bool:
    """Whether ``password`` is the one ``credential`` was made from (constant-time comparison)."""
    got = _scrypt(password, credential.salt, credential.n, credential.r, credential.p)
    return hmac.compare_digest(got, credential.hash)


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=2 * 128 * r * n + (1 << 20), dklen=32)


def check_user_name(name: str) -> str:
    """``name`` if it can name a user (non-empty, no control characters), else :class:`ConfigError`."""
    if not isinstance(name, str) or not name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ConfigError(f"a user name must be non-empty text without control characters, got {name!r}")
    return name


class CredentialStore:
    """The users of the log directory ``root``. Changes (:meth:`add`, :meth:`delete`) are written at once;
    lookups (:meth:`lookup`) see changes made by other processes at their next call."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(security_dir(root), USERS_FILE)
        self._watched = Watched(self.path, _load)

    def users(self) -> dict[str, list[str]]:
        """User name -> the mechanisms it has credentials for (sorted)."""
        return {name: sorted(mechs) for name, mechs in sorted(self._watched.get().items())}

    def lookup(self, name: str, mechanism: str) -> Credential | None:
        """The credential of ``name`` for ``mechanism``, None when there is none."""
        return self._watched.get().get(name, {}).get(mechanism)

    def add(
        self,
        name: str,
        password: str,
        mechanisms: tuple[str, ...] = MECHANISMS,
        iterations: int = DEFAULT_ITERATIONS,
    ) -> None:
        """Create ``name``, or replace its credentials: afterwards it has credentials for ``mechanisms`` only,
        all made from ``password`` (so a changed password leaves no mechanism accepting the old one)."""
        check_user_name(name)
        if not isinstance(password, str) or not password:
            raise ConfigError("a password must be non-empty text")
        for mechanism in mechanisms:
            if mechanism not in MECHANISMS:
                raise ConfigError(f"unknown SASL mechanism {mechanism!r} (known: {', '.join(MECHANISMS)})")
        made: dict[str, Credential] = {
            m: plain_credential(password) if m == "PLAIN" else scram_credential(m, password, None, iterations)
            for m in mechanisms
        }
        directory = security_dir(self.root, create=True)
        with locked(directory):
            users = _load(self.path)
            users[name] = made
            write_private(self.path, _dump(users))

    def alter(
        self, upsertions: dict[tuple[str, str], Credential], deletions: list[tuple[str, str]]
    ) -> dict[str, str | None]:
        """Set the credential of each (user, mechanism) of ``upsertions`` and remove those of ``deletions``,
        in one write; per user, None or why its changes were refused (then none of them is made)."""
        directory = security_dir(self.root, create=True)
        with locked(directory):
            users = _load(self.path)
            errors: dict[str, str | None] = {}
            for name, mechanism in deletions:
                errors.setdefault(name, None)
                if mechanism not in users.get(name, {}):
                    errors[name] = f"user {name!r} has no {mechanism} credential"
            for (name, _mechanism), _credential in upsertions.items():
                errors.setdefault(name, None)
            for name, mechanism in deletions:
                if errors[name] is None:
                    del users[name][mechanism]
                    if not users[name]:
                        del users[name]
            for (name, mechanism), credential in upsertions.items():
                if errors[name] is None:
                    users.setdefault(name, {})[mechanism] = credential
            if any(e is None for e in errors.values()):
                write_private(self.path, _dump(users))
        return errors

    def delete(self, name: str) -> bool:
        """Remove ``name`` and its credentials; False when there was no such user."""
        directory = security_dir(self.root)
        if not os.path.isdir(directory):
            return False
        with locked(directory):
            users = _load(self.path)
            if users.pop(name, None) is None:
                return False
            write_private(self.path, _dump(users))
        return True


def _load(path: str) -> dict[str, dict[str, Credential]]:
    raw = read_private(path)
    if raw is None:
        return {}
    try:
        data = json.loads(unframe(raw, _MAGIC, _FORMAT, f"users file {path}"))
        return {
            check_user_name(name): {m: _credential(m, c) for m, c in mechs.items()}
            for name, mechs in data["users"].items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{path} does not check ({exc}): restore it from a backup, or delete it and add the users again"
        ) from exc


def _credential(mechanism: str, c: dict[str, Any]) -> Credential:
    if mechanism == "PLAIN":
        return PlainCredential(_b64(c["salt"]), int(c["n"]), int(c["r"]), int(c["p"]), _b64(c["hash"]))
    if mechanism not in SCRAM_HASHES:
        raise ValueError(f"unknown mechanism {mechanism!r}")
    return ScramCredential(
        _b64(c["salt"]), int(c["iterations"]), _b64(c["stored_key"]), _b64(c["server_key"])
    )


def _dump(users: dict[str, dict[str, Credential]]) -> bytes:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, mechs in users.items():
        out[name] = {}
        for mechanism, c in mechs.items():
            if isinstance(c, PlainCredential):
                out[name][mechanism] = {"salt": _s(c.salt), "n": c.n, "r": c.r, "p": c.p, "hash": _s(c.hash)}
            else:
                out[name][mechanism] = {
                    "salt": _s(c.salt),
                    "iterations": c.iterations,
                    "stored_key": _s(c.stored_key),
                    "server_key": _s(c.server_key),
                }
    return frame(_MAGIC, _FORMAT, json.dumps({"users": out}, sort_keys=True).encode())


def _b64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def _s(data: bytes) -> str:
    return base64.b64encode(data).decode()
