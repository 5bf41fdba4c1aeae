"""Security defaults: loopback unless told otherwise, a token whenever not on loopback, limits
that are configurable and documented, and tokens that never reach the server's own log."""

from __future__ import annotations

import re

import httpx
import psutil
import pytest

from hardening_helpers import REPO
from medvqa_env.errors import ConfigError
from tool_backends.cli import build_parser, main as tools_main, parse
from tool_backends.server import ServerSettings, check_settings

TOKEN = "tok-defaults-9d2e-DO-NOT-LOG"


@pytest.mark.parametrize("argv", [["serve", "--tools", "segment"], ["router", "--upstream", "segment=http://x:1"]])
def test_servers_bind_loopback_by_default(argv):
    assert parse(argv)[1].host == "127.0.0.1"


def test_a_started_server_listens_on_loopback_only(server_factory):
    server = server_factory("serve", ["--tools", "image_zoom_in"])
    listening = [c.laddr for c in psutil.Process(server.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.5", "192.168.1.20", "example.org", "127.0.0.1.nip.io"])
def test_non_loopback_hosts_need_a_token(host):
    with pytest.raises(ConfigError, match="without a token"):
        check_settings(ServerSettings(host=host))
    check_settings(ServerSettings(host=host, token="t"))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_need_no_token(host):
    check_settings(ServerSettings(host=host))


def test_the_router_refuses_an_open_bind_without_a_token(capsys):
    code = tools_main(["router", "--upstream", "segment=http://127.0.0.1:1", "--host", "0.0.0.0", "--port", "1",
                       "--wait-s", "0"])
    assert code == 2 and "without a token" in capsys.readouterr().err


def test_the_model_server_refuses_an_open_bind_without_an_api_key(capsys):
    from agents.openai_server import main as model_main

    assert model_main(["--host", "0.0.0.0", "--port", "1"]) == 2
    assert "python -m agents.openai_server: error: refusing to serve on '0.0.0.0' without --api-key-env" in \
        capsys.readouterr().err


def test_limits_must_be_sane():
    for bad in (ServerSettings(max_concurrency=0), ServerSettings(max_body_bytes=10)):
        with pytest.raises(ConfigError, match="expected"):
            check_settings(bad)


def test_every_limit_flag_is_documented(capsys):
    """docs/security.md names each protective CLI flag of ``medvqa-tools`` (a drift check)."""
    text = (REPO / "docs" / "security.md").read_text()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])  # simple-parsing adds its flags while parsing
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", capsys.readouterr().out))
    protective = {"--host", "--token-env", "--max-concurrency", "--max-queue", "--max-body-mb", "--max-pixels",
                  "--image-root", "--max-request-pixels", "--max-result-pixels", "--max-batch-calls",
                  "--max-action-chars", "--result-dir-mb", "--read-timeout-s", "--max-connections"}
    assert protective <= flags, protective - flags
    missing = [f for f in sorted(protective) if not re.search(re.escape(f) + r"\b", text)]
    assert not missing, f"docs/security.md does not document {missing}"


def test_the_server_log_never_holds_the_token(server_factory):
    server = server_factory("serve", ["--tools", "image_zoom_in", "--token-env", "HARDEN_DEFAULTS_TOKEN",
                                      "--log-level", "debug"], env={"HARDEN_DEFAULTS_TOKEN": TOKEN})
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/tools").status_code == 401
        assert client.get("/tools", headers={"Authorization": f"Bearer {TOKEN}x"}).status_code == 401
        assert client.get("/tools", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        bad = client.post("/call", content=b"{", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bad.status_code == 400 and TOKEN not in bad.text
    server.close()
    log = server.log()
    assert "serving" in log and TOKEN not in log
