"""Cross-origin access to ``/v1/realtime/calls`` (the browser SDK's WebRTC offer), and to nothing else."""

import pytest

pytestmark = pytest.mark.django_db

APP = "http://app.example.test:5173"


def test_a_preflight_for_the_calls_endpoint_allows_any_origin_without_credentials(client):
    response = client.options(
        "/v1/realtime/calls",
        headers={
            "Origin": APP,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type,x-openai-agents-sdk",
        },
    )
    assert response.status_code == 204
    assert response["Access-Control-Allow-Origin"] == "*"
    allowed = {h.strip().lower() for h in response["Access-Control-Allow-Headers"].split(",")}
    assert {"authorization", "content-type", "x-openai-agents-sdk"} <= allowed
    assert "POST" in response["Access-Control-Allow-Methods"]
    assert "Access-Control-Allow-Credentials" not in response  # so no cookie rides along
    assert response["Access-Control-Expose-Headers"] == "Location"


def test_the_mint_endpoint_and_pages_get_no_cors(client):
    for path in ("/v1/realtime/client_secrets", "/accounts/login/"):
        response = client.options(path, headers={"Origin": APP, "Access-Control-Request-Method": "POST"})
        assert "Access-Control-Allow-Origin" not in response, path
