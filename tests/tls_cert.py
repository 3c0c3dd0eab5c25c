"""A self-signed certificate for 127.0.0.1 and localhost, made on the spot with `cryptography`.

For tests of the API over HTTPS. Importable as `tls_cert` because pytest puts `tests/` on
the path (its conftest).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALIDITY = datetime.timedelta(days=1)


@attrs.frozen
class SelfSigned:
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts this certificate (and nothing else)."""
        return ssl.create_default_context(cafile=str(self.cert))


def make_self_signed(directory: Path) -> SelfSigned:
    """Write `cert.pem` and `key.pem` (P-256) into `directory`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trexo test")])
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    paths = SelfSigned(directory / "cert.pem", directory / "key.pem")
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths
