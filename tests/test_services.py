"""The throwaway servers of tests/services.py: real servers that clients reach, and that go away afterwards."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import boto3
import psycopg
import pytest
import redis
from botocore.exceptions import ClientError

from tests import services

ROOT = Path(__file__).resolve().parents[1]


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection((services.HOST, port), timeout=1):
            return False
    except OSError:
        return True


def test_free_port_can_be_bound():
    port = services.free_port()
    with socket.socket() as sock:
        sock.bind((services.HOST, port))


def test_redis_server_stores_and_returns_values(redis_server):
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    client = redis.Redis.from_url(redis_server.url)
    client.set("parley-probe", b"\x00frame")
    assert client.get("parley-probe") == b"\x00frame"
    assert client.config_get("save") == {"save": ""}  # nothing is written to disk


def test_redis_with_a_password_refuses_clients_without_it():
    with services.start_redis(password="pw-for-this-test") as server:
        assert server.url == f"redis://:pw-for-this-test@127.0.0.1:{server.port}/0"
        anonymous = redis.Redis(host=server.host, port=server.port)
        with pytest.raises(redis.AuthenticationError):
            anonymous.set("parley:services", b"forged")
        anonymous.close()
        wrong = redis.Redis(host=server.host, port=server.port, password="not-it")
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()
        wrong.close()
        client = redis.Redis.from_url(server.database_url(1))  # another database, the same password
        client.set("parley-probe", b"ok")
        assert client.get("parley-probe") == b"ok"
        assert client.connection_pool.connection_kwargs["db"] == 1
        client.close()
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        assert "pw-for-this-test" not in ps  # the password is in a 0600 file, not on a command line


def test_postgres_server_is_a_fresh_database_with_a_superuser(postgres_server):
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        database, user, superuser = conn.execute(
            "select current_database(), current_user, rolsuper from pg_roles where rolname = current_user"
        ).fetchone()
        assert (database, user, superuser) == (postgres_server.database, postgres_server.user, True)
        assert conn.execute("select count(*) from pg_tables where schemaname = 'public'").fetchone() == (0,)
        # Django's test runner creates and drops its own database next to this one.
        conn.execute("create database parley_probe")
        conn.execute("drop database parley_probe")
    assert any(postgres_server.socket_dir.glob(".s.PGSQL.*")), "the unix socket lives in the temporary directory"


def test_s3_server_speaks_s3_over_http(s3_server):
    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key=s3_server.secret_key,
        region_name=s3_server.region,
    )
    client.put_object(Bucket=s3_server.bucket, Key="recordings/probe.wav", Body=b"RIFF....")
    assert client.get_object(Bucket=s3_server.bucket, Key="recordings/probe.wav")["Body"].read() == b"RIFF...."
    listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix="recordings/")
    assert [item["Key"] for item in listed["Contents"]] == ["recordings/probe.wav"]
    client.delete_object(Bucket=s3_server.bucket, Key="recordings/probe.wav")
    with pytest.raises(ClientError) as missing:
        client.get_object(Bucket=s3_server.bucket, Key="recordings/probe.wav")
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"


def test_a_stopped_server_is_gone_with_its_files():
    with services.start_redis() as server:
        folder = Path(redis.Redis.from_url(server.url).config_get("dir")["dir"])
        assert folder.is_dir()
    assert refuses_connections(server.port)
    assert not folder.exists()


def test_a_missing_binary_is_named(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(services.ServiceError, match=r"redis-server not found .*apt-get install redis-server"):
        with services.start_redis():
            pass
    monkeypatch.setenv("PARLEY_PG_BINDIR", "/nonexistent")
    with pytest.raises(services.ServiceError, match="PARLEY_PG_BINDIR=/nonexistent has no initdb"):
        with services.start_postgres():
            pass


def test_command_line_prints_urls_and_stops_on_sigterm():
    cli = subprocess.Popen(
        [sys.executable, "-m", "tests.services", "redis"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        url_line = cli.stdout.readline().strip()
        assert cli.stdout.readline().strip() == "READY"
        assert url_line.startswith("REDIS_URL=redis://127.0.0.1:")
        url = url_line.removeprefix("REDIS_URL=")
        assert redis.Redis.from_url(url).ping()
        cli.terminate()
        assert cli.wait(timeout=30) == 0
        assert refuses_connections(redis.Redis.from_url(url).connection_pool.connection_kwargs["port"])
    finally:
        if cli.poll() is None:
            cli.kill()
