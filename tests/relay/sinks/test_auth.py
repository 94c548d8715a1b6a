"""Credentials: token sources (inline, env, rotating file) and TLS towards a collector, the
latter against a real HTTPS server on loopback with a CA made in the test."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import threading

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from relay.config import CollectorConfig
from relay.errors import ConfigError
from relay.metrics import RelayMetrics
from relay.sinks.auth import TokenSource, ssl_context
from relay.sinks.http import HttpCollector
from tests.support.clock import Clock
from tests.support.relay import ON_EACH_LOOP

BODY = b'{"eventTime":"2024-01-01T00:00:00Z","producer":"p","schemaURL":"s","run":{"runId":"x"},"job":{}}'


def config(**kw) -> CollectorConfig:
    return CollectorConfig(name="c", url="https://collector.example", **kw)


def test_inline_and_env_tokens_are_fixed_and_never_in_repr(monkeypatch):
    assert TokenSource(config(token="inline-s3cret")).current() == "inline-s3cret"
    monkeypatch.setenv("C_TOKEN", "env-s3cret\n")
    source = TokenSource(config(token_env="C_TOKEN"))
    assert source.current() == "env-s3cret" and not source.rotates
    assert "s3cret" not in repr(source)
    monkeypatch.delenv("C_TOKEN")
    with pytest.raises(ConfigError, match=r"collectors\.c\.token_env: environment variable C_TOKEN is not set"):
        TokenSource(config(token_env="C_TOKEN"))


def test_token_file_is_reread_when_it_changes_at_most_once_per_interval(tmp_path):
    path = tmp_path / "token"
    path.write_text("first\n")
    clock = Clock()
    source = TokenSource(config(token_file=str(path)), clock=clock, check_every_s=1.0)
    assert source.rotates and source.current() == "first"
    path.write_text("second-token")  # a different size, so a different identity even within one mtime tick
    clock.now += 0.5
    assert source.current() == "first", "checked again before the interval passed"
    clock.now += 0.6
    assert source.current() == "second-token"
    assert "second-token" not in repr(source)


def test_token_file_refresh_on_demand_and_mid_rotation_absence_keeps_the_last_token(tmp_path):
    path = tmp_path / "token"
    path.write_text("one")
    clock = Clock()
    source = TokenSource(config(token_file=str(path)), clock=clock)
    path.write_text("two!")
    assert source.refresh() is True and source.current() == "two!"
    assert source.refresh() is False
    os.remove(path)  # a secret volume swaps its files: briefly nothing there
    clock.now += 5
    assert source.current() == "two!"


def test_missing_or_empty_token_file_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"collectors\.c\.token_file: cannot read .*mount the secret"):
        TokenSource(config(token_file=str(tmp_path / "absent")))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"token_file: .* is empty"):
        TokenSource(config(token_file=str(tmp_path / "empty")))


def test_one_token_source_only():
    with pytest.raises(ValueError, match="give the token one way only"):
        config(token="a", token_file="/run/secrets/t")


# -- TLS ---------------------------------------------------------------------------------

def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key, issuer_name: x509.Name, issuer_key, *, ca: bool = False, server: bool = False):
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", ca_key, _name("test-ca"), ca_key, ca=True)
    files = {}
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(f"test-{role}", key, ca.subject, ca_key, server=role == "server")
        (d / f"{role}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / f"{role}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
        files[role] = (str(d / f"{role}.pem"), str(d / f"{role}.key"))
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["ca"] = str(d / "ca.pem")
    return files


@pytest.fixture
def https_collector(pki):
    """An HTTPS collector on loopback that requires a client certificate signed by the CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=pki["ca"])
    context.load_cert_chain(*pki["server"])
    context.verify_mode = ssl.CERT_REQUIRED
    received: list[str] = []

    async def lineage(request: web.Request) -> web.Response:
        await request.read()
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        received.append(dict(x[0] for x in peer["subject"])["commonName"] if peer else "")
        return web.Response(status=201)

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/api/v1/lineage", lineage)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{port}", received
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


async def deliver_once(url: str, **tls) -> object:
    cfg = CollectorConfig(name="c", url=url, tls=tls, retry={"max_attempts": 1})
    collector = HttpCollector(cfg, RelayMetrics().for_collector("c"))
    await collector.start()
    try:
        return await collector.deliver(BODY)
    finally:
        await collector.close()


@ON_EACH_LOOP
async def test_mutual_tls_with_a_private_ca(pki, https_collector):
    url, received = https_collector
    assert await deliver_once(url, ca_bundle=pki["ca"], client_cert=pki["client"][0],
                              client_key=pki["client"][1]) is None
    assert received == ["test-client"]


@ON_EACH_LOOP
async def test_tls_failures_are_not_deliveries(pki, https_collector):
    url, received = https_collector
    no_client_cert = await deliver_once(url, ca_bundle=pki["ca"])
    unknown_ca = await deliver_once(url, client_cert=pki["client"][0], client_key=pki["client"][1])
    for failure in (no_client_cert, unknown_ca):
        assert failure is not None and failure.reason == "retries_exhausted"
    assert "certificate" in unknown_ca.detail.lower()
    assert received == []


def test_unreadable_tls_files_name_the_key(tmp_path, pki):
    with pytest.raises(ConfigError, match=r"collectors\.c\.tls\.ca_bundle: cannot load"):
        ssl_context(config(tls={"ca_bundle": str(tmp_path / "nope.pem")}))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"collectors\.c\.tls\.client_cert: cannot load"):
        ssl_context(config(tls={"client_cert": str(tmp_path / "junk.pem")}))
    with pytest.raises(ValueError, match="client_key needs client_cert"):
        config(tls={"client_key": pki["client"][1]})


@pytest.mark.parametrize("content, why", [
    ("s\u00e9cret-\u00fc".encode("latin-1"), "is not UTF-8 text"),
    ("tok\ufeff".encode("utf-16"), "is not UTF-8 text"),
    (b"first-half\nsecond-half", "line break or a control character"),
])
def test_a_token_file_that_cannot_be_a_token_fails_at_start_and_later_keeps_the_last_token(
        tmp_path, caplog, content, why):
    """Never with the file's content in the error or the log (a decoding error quotes the
    bytes). Later, the last good token stays in use, as during a rotation, instead of every
    request failing (and, before, the token showing in the log of each failure)."""
    path = tmp_path / "token"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=rf"collectors\.c\.token_file: .* {why}") as err:
        TokenSource(config(token_file=str(path)))
    assert b"cret" not in str(err.value).encode() and "half" not in str(err.value)
    path.write_text("good-token")
    clock = Clock()
    source = TokenSource(config(token_file=str(path)), clock=clock)
    path.write_bytes(content + b"-more")  # another size: another identity
    for _ in range(3):
        clock.now += 2
        assert source.current() == "good-token"
    logged = [r for r in caplog.records if r.getMessage() == "token_file_unusable"]
    assert len(logged) == 1, "logged once per change of the file"
    text = str(logged[0].__dict__.get("fields"))
    assert why in text and "cret" not in text and "half" not in text and "good-token" not in text
    path.write_text("next-token")
    clock.now += 2
    assert source.current() == "next-token"


def test_an_inline_or_env_token_with_a_line_break_fails_at_start(monkeypatch):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"token\n.*line break") as err:  # check-config sees it too
        config(token="a-secret\nb")
    assert "a-secret" not in str(err.value)
    monkeypatch.setenv("C_TOKEN", "a\rb")
    with pytest.raises(ConfigError, match=r"collectors\.c\.token_env: .*line break"):
        TokenSource(config(token_env="C_TOKEN"))


def test_an_inline_token_ending_in_a_newline_is_sent_without_it():
    """token: ${TOKEN} with TOKEN from a Secret made from a file ends in a newline: the
    config takes it, so the header must not carry it (aiohttp refused every request)."""
    assert TokenSource(config(token="inline-s3cret\n")).current() == "inline-s3cret"


def test_an_encrypted_client_key_fails_at_start_naming_the_key_without_a_passphrase_prompt(tmp_path, pki):
    """OpenSSL's default for an encrypted key is to prompt ``Enter PEM pass phrase:`` on the
    terminal: run (or check-config) from a shell waited there for ever, and without a
    terminal failed with ``(Invalid argument)``. Run without a controlling terminal (a new
    session), so that the old behaviour fails this test rather than hanging it."""
    key = serialization.load_pem_private_key(open(pki["client"][1], "rb").read(), password=None)
    encrypted = tmp_path / "client.key"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"passphrase")))
    path = tmp_path / "relay.yaml"
    path.write_text(json.dumps({
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"]},
        "collectors": [{"name": "c", "url": "https://127.0.0.1:8443",
                        "tls": {"client_cert": pki["client"][0], "client_key": str(encrypted)}}]}))
    done = subprocess.run([sys.executable, "-m", "relay", "check-config", str(path)], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, start_new_session=True, timeout=60)
    assert done.returncode == 2, done
    assert f"collectors.c.tls.client_key: the private key in {encrypted} is encrypted" in done.stderr, done.stderr
    assert "openssl pkey" in done.stderr
    assert "pass phrase" not in done.stderr.lower(), "OpenSSL prompted for a passphrase"


@pytest.mark.parametrize("value", ["\n", "  ", " \r\n"])
def test_a_token_env_holding_only_blanks_fails_at_start_like_an_empty_one(monkeypatch, value):
    """A Secret made from a file holding only a newline: the token sent would be empty
    (``Authorization: Bearer ``), as with an unset variable, which fails at start-up."""
    monkeypatch.setenv("C_TOKEN", value)
    with pytest.raises(ConfigError,
                       match=r"collectors\.c\.token_env: environment variable C_TOKEN is not set or empty"):
        TokenSource(config(token_env="C_TOKEN"))


def test_a_token_file_saved_with_a_byte_order_mark_is_read_without_it(tmp_path):
    """Windows editors and PowerShell 5's ``Out-File -Encoding utf8`` write a UTF-8 byte
    order mark first: it failed at start-up as a line break or a control character."""
    path = tmp_path / "token"
    path.write_bytes("\ufeffbom-token\r\n".encode())
    assert TokenSource(config(token_file=str(path))).current() == "bom-token"
