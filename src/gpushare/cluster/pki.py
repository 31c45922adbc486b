"""Certificates and keys for a local cluster: one CA signs everything.

ECDSA P-256 keys throughout (fast to make; Go's TLS and the service-account token signer
take them). Private keys are written mode 0600 into the state dir, which is mode 0700.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
CLOCK_SKEW = datetime.timedelta(minutes=5)
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"

ADMIN_USER = "gpushare-admin"
ADMIN_GROUP = "system:masters"  # the superuser group: every request is allowed
SCHEDULER_USER = "system:kube-scheduler"  # bound to its roles by the default RBAC policy


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert: Path
    key: Path

    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    def key_pem(self) -> bytes:
        return self.key.read_bytes()


@dataclass(frozen=True, slots=True)
class Pki:
    """Paths of everything `up` needs; made by ``create``."""

    ca: KeyPair
    apiserver: KeyPair  # serving, for 127.0.0.1 and the kubernetes service names
    etcd: KeyPair  # etcd's serving and peer certificate
    etcd_client: KeyPair  # kube-apiserver's client certificate for etcd
    admin: KeyPair  # client, system:masters
    scheduler: KeyPair  # client, system:kube-scheduler
    scheduler_serving: KeyPair  # kube-scheduler's /healthz and /readyz
    service_account_key: Path  # signs service-account tokens
    service_account_pub: Path  # verifies them


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(pem)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


class _Signer:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.now = datetime.datetime.now(datetime.UTC)
        self.ca_key = _key()
        ca_name = _name("gpushare-local-ca")
        self.ca_cert = (
            self._builder(ca_name, ca_name, self.ca_key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.ca_key.public_key()),
                critical=False,
            )
            .sign(self.ca_key, hashes.SHA256())
        )
        self.ca = self._write("ca", self.ca_cert, self.ca_key)

    def _builder(
        self, subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.now - CLOCK_SKEW)
            .not_valid_after(self.now + VALIDITY)
        )

    def _write(self, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> KeyPair:
        pair = KeyPair(self.folder / f"{stem}.crt", self.folder / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organization: str | None = None,
        server: bool = False,
        client: bool = False,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> KeyPair:
        key = _key()
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            self._builder(_name(common_name, organization), self.ca_cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()),
                critical=False,
            )
        )
        if dns or ips:
            names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
            names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return self._write(stem, builder.sign(self.ca_key, hashes.SHA256()), key)


def _key_usage(cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def create(folder: Path) -> Pki:
    """A fresh CA and every certificate and key the control plane needs, in ``folder``."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    signer = _Signer(folder)
    loopback = ("127.0.0.1", "::1")
    apiserver = signer.issue(
        "apiserver",
        "kube-apiserver",
        server=True,
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=(*loopback, KUBERNETES_SERVICE_IP),
    )
    etcd = signer.issue("etcd", "etcd", server=True, client=True, dns=("localhost",), ips=loopback)
    etcd_client = signer.issue("apiserver-etcd-client", "kube-apiserver-etcd-client", client=True)
    admin = signer.issue("admin", ADMIN_USER, organization=ADMIN_GROUP, client=True)
    scheduler = signer.issue("scheduler", SCHEDULER_USER, client=True)
    scheduler_serving = signer.issue(
        "scheduler-serving", "kube-scheduler", server=True, dns=("localhost",), ips=loopback
    )
    sa_key = _key()
    sa_key_path = folder / "sa.key"
    _write_key(sa_key_path, sa_key)
    sa_pub_path = folder / "sa.pub"
    sa_pub_path.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        ca=signer.ca,
        apiserver=apiserver,
        etcd=etcd,
        etcd_client=etcd_client,
        admin=admin,
        scheduler=scheduler,
        scheduler_serving=scheduler_serving,
        service_account_key=sa_key_path,
        service_account_pub=sa_pub_path,
    )


def load(folder: Path) -> Pki:
    """The paths of a ``create``d folder (no files are read)."""

    def pair(stem: str) -> KeyPair:
        return KeyPair(folder / f"{stem}.crt", folder / f"{stem}.key")

    return Pki(
        ca=pair("ca"),
        apiserver=pair("apiserver"),
        etcd=pair("etcd"),
        etcd_client=pair("apiserver-etcd-client"),
        admin=pair("admin"),
        scheduler=pair("scheduler"),
        scheduler_serving=pair("scheduler-serving"),
        service_account_key=folder / "sa.key",
        service_account_pub=folder / "sa.pub",
    )
