"""The broker's users (``pylog users``) and SASL's server side, checked against the RFCs' test vectors."""

from __future__ import annotations

import base64
import io
import os
import stat
import threading
from pathlib import Path

import pytest

import pylog
from pylog.broker.credentials import CredentialStore, plain_credential, scram_credential, verify_plain
from pylog.broker.sasl import AuthenticationFailed, PlainServer, ScramServer, scram_proof
from pylog.cli import main
from pylog.errors import ConfigError


def run(
    args: list[str], stdin: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main(args) == 0
    return capsys.readouterr().out


def test_users_cli_stores_no_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(tmp_path / "log")
    run(["--dir", d, "users", "add", "alice"], "correct horse battery\n", monkeypatch, capsys)
    run(
        ["--dir", d, "users", "add", "bob", "--mechanism", "SCRAM-SHA-512"],
        "b0b-secret\n",
        monkeypatch,
        capsys,
    )
    out = run(["--dir", d, "users", "list"], "", monkeypatch, capsys)
    assert out == "alice PLAIN,SCRAM-SHA-256,SCRAM-SHA-512\nbob SCRAM-SHA-512\n"
    users = Path(d, "__security", "users")
    assert stat.S_IMODE(users.stat().st_mode) == 0o600
    assert stat.S_IMODE(users.parent.stat().st_mode) == 0o700
    for entry in Path(d, "__security").iterdir():  # nothing on disk holds a password, in any encoding
        raw = entry.read_bytes()
        for secret in ("correct horse battery", "b0b-secret"):
            for form in (secret.encode(), base64.b64encode(secret.encode()), secret.encode().hex().encode()):
                assert form not in raw
    # the stored forms check the passwords, and only them
    store = CredentialStore(d)
    plain = store.lookup("alice", "PLAIN")
    assert plain is not None and not isinstance(plain, type(store.lookup("alice", "SCRAM-SHA-256")))
    assert PlainServer(store.lookup).step(b"\0alice\0correct horse battery") == b""
    with pytest.raises(AuthenticationFailed):
        PlainServer(store.lookup).step(b"\0alice\0correct horse batterY")
    with pytest.raises(AuthenticationFailed):  # bob has no PLAIN credential
        PlainServer(store.lookup).step(b"\0bob\0b0b-secret")
    # replacing a user replaces all its credentials
    run(["--dir", d, "users", "add", "alice", "--mechanism", "PLAIN"], "new one\n", monkeypatch, capsys)
    assert store.users() == {"alice": ["PLAIN"], "bob": ["SCRAM-SHA-512"]}
    run(["--dir", d, "users", "delete", "alice"], "", monkeypatch, capsys)
    assert store.users() == {"bob": ["SCRAM-SHA-512"]}
    assert main(["--dir", d, "users", "delete", "alice"]) == 1
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert main(["--dir", d, "users", "add", "carol"]) == 1  # empty password
    assert "no password" in capsys.readouterr().err


def test_the_log_opens_beside_its_users(tmp_path: Path) -> None:
    CredentialStore(str(tmp_path / "log")).add("alice", "pw")
    with pylog.open(
        tmp_path / "log"
    ) as log:  # __security is pylog's own: no unknown-entry warning, no refusal
        log.create_topic("t")


def test_users_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    store = CredentialStore(str(tmp_path))
    store.add("alice", "pw", ("SCRAM-SHA-256",))
    os.chmod(store.path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        CredentialStore(str(tmp_path)).users()


def test_damaged_users_file_authenticates_nobody(tmp_path: Path) -> None:
    store = CredentialStore(str(tmp_path))
    store.add("alice", "pw", ("SCRAM-SHA-256",))
    raw = bytearray(Path(store.path).read_bytes())
    raw[-5] ^= 1
    Path(store.path).write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match="does not check"):
        CredentialStore(str(tmp_path)).lookup("alice", "SCRAM-SHA-256")


def test_concurrent_adds_lose_no_user(tmp_path: Path) -> None:
    def add(i: int) -> None:
        CredentialStore(str(tmp_path)).add(f"user{i}", "pw", ("SCRAM-SHA-256",))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(CredentialStore(str(tmp_path)).users()) == sorted(f"user{i}" for i in range(8))


def test_scram_sha_256_rfc7677_vector() -> None:
    """RFC 7677 section 3: user "user", password "pencil", the nonces, salt and iterations given there."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = scram_credential("SCRAM-SHA-256", "pencil", salt, 4096)
    server = ScramServer(
        "SCRAM-SHA-256",
        lambda u, m: credential if u == "user" else None,
        lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
    )
    first = server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = server.step(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.done and server.user == "user"


def test_scram_rfc5802_vector_and_wrong_proofs() -> None:
    """RFC 5802 section 5 (SHA-1) for the proof computation; then a wrong password and an unknown user fail
    at the proof, with the same message."""
    auth = (
        b"n=user,r=fyko+d2lbbFgONRv9qkxdawL,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,"
        b"i=4096,c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j"
    )
    proof = scram_proof("sha1", "pencil", base64.b64decode("QSXCR+Q6sek8bf92"), 4096, auth)
    assert base64.b64encode(proof) == b"v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="

    credential = scram_credential("SCRAM-SHA-512", "right")
    messages = []
    for user, password in (("alice", "wrong"), ("nobody", "right")):
        server = ScramServer("SCRAM-SHA-512", lambda u, m: credential if u == "alice" else None, lambda: "S")
        first = server.step(f"n,,n={user},r=C".encode()).decode()
        fields = dict(f.split("=", 1) for f in first.split(","))
        without = "c=biws,r=CS"
        auth = f"n={user},r=C,{first},{without}".encode()
        p = scram_proof("sha512", password, base64.b64decode(fields["s"]), int(fields["i"]), auth)
        with pytest.raises(AuthenticationFailed) as info:
            server.step(f"{without},p={base64.b64encode(p).decode()}".encode())
        messages.append(str(info.value))
        assert not server.done
    assert messages[0] == messages[1]


def test_plain_credential() -> None:
    c = plain_credential("s3cret")
    assert verify_plain(c, b"s3cret") and not verify_plain(c, b"s3cres")
    assert c.hash != plain_credential("s3cret").hash  # salted
