"""toolnexus.client: building clients (`create_client`, `create_in_process_client`)."""

from __future__ import annotations

import httpx
import pytest

import toolnexus
import toolnexus.client as client_module
from toolnexus import create_client, create_in_process_client
from toolnexus.dialects import ANTHROPIC, OPENAI
from toolnexus.in_process import InProcessModel
from toolnexus.model_http import DEFAULT_LIMITS, HTTPModel


def test_names_stay_importable_from_toolnexus_client():
    for name in (
        "Client",
        "InProcessRequest",
        "InProcessResponse",
        "InProcessToolCall",
        "create_client",
        "create_in_process_client",
    ):
        assert getattr(client_module, name) is getattr(toolnexus, name)
    assert callable(client_module.declined_text)


def test_options_go_to_the_loop_or_to_the_endpoint():
    limits = httpx.Limits(max_connections=4)
    client = create_client(
        base_url="http://m.test/v1",
        model="m",
        api_key="k",
        system_prompt="sys",
        max_turns=3,
        timeout=9,
        retries=5,
        retry_base_ms=10,
        request_timeout=30,
        limits=limits,
    )
    assert (client.model, client.system_prompt, client.max_turns, client.timeout) == (
        "m",
        "sys",
        3,
        9,
    )
    model = client.backend
    assert isinstance(model, HTTPModel) and client.dialect is OPENAI
    assert (model.retries, model.retry_base, model.limits) == (5, 0.01, limits)
    assert model._timeout == httpx.Timeout(30)


def test_defaults():
    client = create_client(base_url="http://m.test", model="m", api_key="k")
    assert client.max_turns == 10 and client.timeout is None and client.system_prompt == ""
    assert client.backend.retries == 2 and client.backend.limits is DEFAULT_LIMITS


def test_an_unknown_option_or_style_is_refused():
    with pytest.raises(TypeError, match="colour"):
        create_client(base_url="http://m.test", model="m", colour="red")
    with pytest.raises(ValueError, match="style must be"):
        create_client(base_url="http://m.test", model="m", style="gemini")
    with pytest.raises(ValueError, match="max_turns"):
        create_client(base_url="http://m.test", model="m", max_turns=0)


@pytest.mark.parametrize(
    "style, base, url",
    [
        ("openai", "http://m.test/v1/", "http://m.test/v1/chat/completions"),
        ("anthropic", "https://api.anthropic.com", "https://api.anthropic.com/v1/messages"),
        ("anthropic", "https://proxy.test/v1", "https://proxy.test/v1/messages"),
    ],
)
def test_endpoint_urls(style, base, url):
    assert create_client(base_url=base, style=style, model="m").backend.url == url


def test_keys_come_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ak-env")
    openai = create_client(base_url="http://m.test", model="m").backend.headers
    anthropic = create_client(base_url="http://m.test", style="anthropic", model="m")
    assert openai["authorization"] == "Bearer sk-env"
    assert anthropic.dialect is ANTHROPIC
    assert anthropic.backend.headers["x-api-key"] == "ak-env"
    assert anthropic.backend.headers["anthropic-version"] == "2023-06-01"
    monkeypatch.delenv("OPENAI_API_KEY")
    assert "authorization" not in create_client(base_url="http://m.test", model="m").backend.headers


def test_caller_headers_win_over_the_defaults():
    headers = {"authorization": "Bearer mine", "x-extra": "1"}
    model = create_client(base_url="http://m.test", model="m", api_key="k", headers=headers).backend
    assert model.headers["authorization"] == "Bearer mine" and model.headers["x-extra"] == "1"
    assert model.headers["content-type"] == "application/json"


def test_the_in_process_client():
    client = create_in_process_client(generate=lambda req: "x", model="fn", retries=1)
    assert isinstance(client.backend, InProcessModel) and client.dialect is OPENAI
    assert client.model == "fn" and client.backend.retries == 1
    # accepted as always, with nothing to time
    create_in_process_client(generate=lambda req: "x", request_timeout=5)
    with pytest.raises(TypeError, match="callable"):
        create_in_process_client(generate="not a function")
