"""The API server's TLS: a certificate authority and a serving certificate for 127.0.0.1, made
with the ``openssl`` command when the cluster starts (kept in its workdir).

A real API server speaks HTTPS only, and clients behave accordingly: kubectl (client-go's
clientcmd) sends a kubeconfig's credentials only over TLS, so against plain HTTP it is
``system:anonymous``. Without ``openssl`` on the machine the server falls back to HTTP, where
the official Python client still sends its token and kubectl does not.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.test_utils

SERVER_EXTENSIONS = (
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=serverAuth\n"
    "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
    "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
)


@dataclass(frozen=True)
class Certificates:
    ca: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self.cert), str(self.key))
        return ctx


def make_certificates(directory: Path) -> Certificates | None:
    """A CA (``ca.crt``) and a serving certificate signed by it; None without ``openssl``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key, csr = directory / "apiserver.crt", directory / "apiserver.key", directory / "apiserver.csr"
    ext = directory / "apiserver.ext"
    ext.write_text(SERVER_EXTENSIONS)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    try:
        run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "3650",
            "-subj", "/CN=kcluster-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        run("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=kube-apiserver")
        run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "3650", "-sha256", "-extfile", str(ext))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        return None
    return Certificates(ca=ca, cert=cert, key=key)


def server_factory(ctx: ssl.SSLContext | None) -> type[aiohttp.test_utils.RawTestServer]:
    """kmock's server class, listening with TLS when ``ctx`` is given."""

    class Server(aiohttp.test_utils.RawTestServer):
        async def start_server(self, loop: Any = None, **kwargs: Any) -> None:
            if ctx is not None:
                kwargs["ssl"] = ctx
            await super().start_server(loop=loop, **kwargs)

    return Server
