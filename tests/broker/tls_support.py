"""A test certificate authority made in the test (``cryptography``): the broker's certificate for 127.0.0.1 and
localhost, and client certificates, as PEM files in a directory."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate (PEM): clients trust it, the broker checks client certificates with it
    cert: Path  # the broker's certificate
    key: Path  # the broker's key

    def client(self, common_name: str, organization: str = "pylog tests") -> tuple[Path, Path]:
        """A client certificate and key signed by the CA, subject CN=common_name,O=organization."""
        return _issue(self.ca.parent, self.ca.parent / "ca.key", common_name, organization, server=False)


def make_pki(directory: Path, ca_name: str = "pylog test CA") -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    _write(directory / "ca.pem", cert, directory / "ca.key", key)
    server_cert, server_key = _issue(directory, directory / "ca.key", "localhost", None, server=True)
    return Pki(directory / "ca.pem", server_cert, server_key)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


def _issue(directory: Path, ca_key_path: Path, cn: str, org: str | None, server: bool) -> tuple[Path, Path]:
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    builder = _builder(x509.Name(attrs), ca_cert.subject, key.public_key())
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    stem = "server" if server else f"client-{cn}"
    _write(directory / f"{stem}.pem", cert, directory / f"{stem}.key", key)
    return directory / f"{stem}.pem", directory / f"{stem}.key"


def _write(cert_path: Path, cert: x509.Certificate, key_path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
