"""SASL's server side for the broker: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, RFC 7677).

A mechanism is a small state machine: :meth:`step` takes the client's next message and returns the server's
answer; :attr:`done` is set once the client is authenticated, and :class:`AuthenticationFailed` is raised
(with a message safe to send to the client: it never says whether the user or the password was wrong) on a
wrong password, an unknown user, or a malformed message.

SCRAM, as the broker runs it::

    client-first   n,,n=<user>,r=<client nonce>               ("n,," : no channel binding, no authzid)
    server-first   r=<client nonce><server nonce>,s=<salt b64>,i=<iterations>
    client-final   c=biws,r=<nonce>,p=<proof b64>
    server-final   v=<server signature b64>

    AuthMessage     = client-first-bare "," server-first "," client-final-without-proof
    ClientSignature = HMAC(StoredKey, AuthMessage); ClientKey = proof XOR ClientSignature
    accepted when H(ClientKey) == StoredKey; ServerSignature = HMAC(ServerKey, AuthMessage)

An unknown user is answered with a made-up salt (derived from the name and a per-process secret, so the
same name always gets the same one) and fails at the proof, like a wrong password: the answers do not tell
which names exist. Kafka's ``tokenauth`` extension (delegation tokens) is refused.

Thread-safety: a mechanism object serves one authentication of one connection; not thread-safe.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Final, Protocol

from pylog.broker.credentials import (
    DEFAULT_ITERATIONS,
    SCRAM_HASHES,
    Credential,
    PlainCredential,
    ScramCredential,
    verify_plain,
)

__all__ = ["AuthenticationFailed", "Mechanism", "PlainServer", "ScramServer", "scram_proof"]

Lookup = Callable[[str, str], Credential | None]  # (user, mechanism) -> its credential
_FAILED: Final = "Authentication failed: invalid credentials"
_SECRET: Final = secrets.token_bytes(32)


class AuthenticationFailed(Exception):
    """The client is not authenticated; the message may be sent to it."""


class Mechanism(Protocol):
    name: str
    done: bool
    user: str | None

    def step(self, message: bytes) -> bytes: ...


class PlainServer:
    """PLAIN: one message ``authzid NUL user NUL password``; the authzid must be empty or the user."""

    name = "PLAIN"

    def __init__(self, lookup: Lookup) -> None:
        self._lookup = lookup
        self.done = False
        self.user: str | None = None

    def step(self, message: bytes) -> bytes:
        if self.done:
            raise AuthenticationFailed("PLAIN takes one message")
        parts = message.split(b"\0")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            raise AuthenticationFailed("malformed PLAIN message")
        try:
            authzid, user = parts[0].decode(), parts[1].decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("malformed PLAIN message") from None
        if authzid and authzid != user:
            raise AuthenticationFailed("PLAIN authorization id must be empty or the user")
        self.user = user
        credential = self._lookup(user, "PLAIN")
        if not isinstance(credential, PlainCredential):
            verify_plain(_DUMMY_PLAIN, parts[2])  # the same work as a known user: no timing oracle
            raise AuthenticationFailed(_FAILED)
        if not verify_plain(credential, parts[2]):
            raise AuthenticationFailed(_FAILED)
        self.done = True
        return b""


class ScramServer:
    """SCRAM-SHA-256 or SCRAM-SHA-512, two round trips (see the module docstring)."""

    def __init__(self, name: str, lookup: Lookup, nonce: Callable[[], str] | None = None) -> None:
        self.name = name
        self._hash = SCRAM_HASHES[name]
        self._lookup = lookup
        self._nonce = nonce or (lambda: secrets.token_urlsafe(24))
        self.done = False
        self.user: str | None = None
        self._state = 0
        self._credential: ScramCredential | None = None
        self._first_bare = ""
        self._server_first = ""
        self._full_nonce = ""

    def step(self, message: bytes) -> bytes:
        try:
            text = message.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("malformed SCRAM message") from None
        if self._state == 0:
            self._state = 1
            return self._first(text).encode()
        if self._state == 1:
            self._state = 2
            return self._final(text).encode()
        raise AuthenticationFailed("SCRAM exchange already finished")

    def _first(self, text: str) -> str:
        gs2, sep, bare = text.partition(",")
        authzid, sep2, bare = bare.partition(",")
        if not sep or not sep2 or gs2 not in ("n", "y") or (authzid and not authzid.startswith("a=")):
            raise AuthenticationFailed(
                "malformed SCRAM client-first message (channel binding is not supported)"
            )
        fields = _fields(bare)
        if "n" not in fields or "r" not in fields or not fields["r"]:
            raise AuthenticationFailed("malformed SCRAM client-first message")
        if fields.get("tokenauth", "false").lower() == "true":
            raise AuthenticationFailed("delegation tokens are not supported")
        user = _unescape(fields["n"])
        if authzid and _unescape(authzid[2:]) != user:
            raise AuthenticationFailed("SCRAM authorization id must be empty or the user")
        found = self._lookup(user, self.name)
        self._credential = found if isinstance(found, ScramCredential) else None
        salt = self._credential.salt if self._credential else hmac.digest(_SECRET, user.encode(), "sha256")
        iterations = self._credential.iterations if self._credential else DEFAULT_ITERATIONS
        self.user = user
        self._first_bare = bare
        self._full_nonce = fields["r"] + self._nonce()
        self._server_first = f"r={self._full_nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        return self._server_first

    def _final(self, text: str) -> str:
        without_proof, sep, proof_field = text.rpartition(",p=")
        fields = _fields(without_proof)
        if not sep or fields.get("r") != self._full_nonce or "c" not in fields:
            raise AuthenticationFailed("malformed SCRAM client-final message")
        if fields["c"] not in ("biws", "eSws"):  # base64 of "n,," and "y,,"
            raise AuthenticationFailed("SCRAM channel binding is not supported")
        try:
            proof = base64.b64decode(proof_field, validate=True)
        except ValueError:
            raise AuthenticationFailed("malformed SCRAM proof") from None
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        credential = self._credential
        if credential is None or len(proof) != len(credential.stored_key):
            raise AuthenticationFailed(_FAILED)
        signature = hmac.digest(credential.stored_key, auth_message, self._hash)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), credential.stored_key):
            raise AuthenticationFailed(_FAILED)
        self.done = True
        server_signature = hmac.digest(credential.server_key, auth_message, self._hash)
        return "v=" + base64.b64encode(server_signature).decode()


def scram_proof(hash_name: str, password: str, salt: bytes, iterations: int, auth_message: bytes) -> bytes:
    """The client's proof (RFC 5802 section 3): for tests and clients written with pylog."""
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", hash_name)
    stored_key = hashlib.new(hash_name, client_key).digest()
    signature = hmac.digest(stored_key, auth_message, hash_name)
    return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))


def _fields(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AuthenticationFailed("malformed SCRAM message")
        out[key] = value
    return out


def _unescape(name: str) -> str:
    """A SCRAM saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is malformed."""
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise AuthenticationFailed("malformed SCRAM user name")
    return name.replace("=2C", ",").replace("=3D", "=")


_DUMMY_PLAIN: Final = PlainCredential(b"\0" * 16, 1 << 14, 8, 1, b"\0" * 32)
