"""API keys, ownership, per-key rate limits and priority tiers (real Redis; no worker needed)."""
import subprocess
import sys

import pytest
from flask import Blueprint, jsonify

from api import create_app
from common.api_keys import KeyConfigError, hash_key, load_keys, parse_entry
from tests.support import ROOT
from tests.support.settings import make_settings, settings_fixture

CHAT = [{"role": "user", "content": "Hello"}]
KEYS = {"alice": "alice-secret-key", "bob": "bob-secret-key", "carol": "carol-secret-key"}


def bearer(name):
    return {"Authorization": f"Bearer {KEYS[name]}"}


def keys_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# staff\ncarol:{hash_key(KEYS['carol'])}:tier=high:concurrent=2\n")
    return path


settings = settings_fixture(api_keys=f"alice:{hash_key(KEYS['alice'])}:rpm=3,bob:{hash_key(KEYS['bob'])}:tier=low",
                            api_keys_file=keys_file)


def submit(api, who, **body):
    return api.post("/v1/jobs", json={"messages": CHAT, "cache": False, **body}, headers=bearer(who))


def assert_error(resp, status, type_):
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert resp.get_json()["error"]["type"] == type_ and resp.get_json()["error"]["message"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "alice-secret-key"},
                                     {"Authorization": "Basic YWxpY2U6eA=="},
                                     {"Authorization": "Bearer "}, {"Authorization": "Bearer nope"},
                                     {"Authorization": f"Bearer {hash_key('alice-secret-key')}"}])
def test_without_a_valid_key_every_route_is_401(api, headers):
    for resp in (api.post("/v1/jobs", json={"messages": CHAT}, headers=headers),
                 api.get("/v1/jobs/anything", headers=headers),
                 api.delete("/v1/jobs/anything", headers=headers),
                 api.get("/v2/not-a-route", headers=headers)):
        assert_error(resp, 401, "authentication_error")
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")


def test_health_and_the_openapi_document_stay_public(api):
    assert api.get("/openapi.json").status_code == 200
    assert api.get("/health").status_code in (200, 503)


def test_auth_covers_blueprints_registered_later(settings, model_ref):
    app = create_app(settings)
    extra = Blueprint("extra", __name__)
    extra.add_url_rule("/v1/extra", view_func=lambda: jsonify(ok=True))
    app.register_blueprint(extra)  # e.g. the OpenAI-compatible endpoints
    client = app.test_client()
    assert_error(client.get("/v1/extra"), 401, "authentication_error")
    assert client.get("/v1/extra", headers=bearer("bob")).status_code == 200


def test_a_key_sees_and_cancels_only_its_own_jobs(api, app):
    resp = submit(api, "bob")
    assert resp.status_code == 202
    job = resp.get_json()
    assert job["owner"] == "bob"
    for who, status in (("carol", 404), ("bob", 200)):
        assert api.get(f"/v1/jobs/{job['id']}", headers=bearer(who)).status_code == status
    assert_error(api.get(f"/v1/jobs/{job['id']}/events", headers=bearer("carol")), 404, "not_found")
    assert_error(api.delete(f"/v1/jobs/{job['id']}", headers=bearer("carol")), 404, "not_found")
    assert_error(api.post(f"/v1/jobs/{job['id']}/cancel", headers=bearer("carol")), 404, "not_found")
    assert api.get(f"/v1/jobs/{job['id']}", headers=bearer("bob")).get_json()["status"] == "queued"
    assert api.delete(f"/v1/jobs/{job['id']}", headers=bearer("bob")).status_code == 200
    # the record names the owner by key id; neither the key nor its hash is stored
    store = app.extensions["llmq"].jobs
    raw = store.r.hgetall(store.keys.job(job["id"]))
    assert raw["owner"] == "bob"
    assert not any(KEYS["bob"] in v or hash_key(KEYS["bob"]) in v for v in raw.values())


def test_requests_per_minute_limit_is_429_with_retry_after_per_key(api):
    accepted = [submit(api, "alice") for _ in range(3)]
    assert [r.status_code for r in accepted] == [202, 202, 202]
    limited = submit(api, "alice")
    assert_error(limited, 429, "rate_limited")
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert submit(api, "bob").status_code == 202  # other keys are not affected
    for resp in accepted:
        api.delete(f"/v1/jobs/{resp.get_json()['id']}", headers=bearer("alice"))


def test_concurrent_jobs_limit_frees_a_slot_when_a_job_ends(api):
    first, second = submit(api, "carol"), submit(api, "carol")
    assert first.status_code == second.status_code == 202
    third = submit(api, "carol")
    assert_error(third, 429, "too_many_concurrent_jobs")
    assert int(third.headers["Retry-After"]) > 0
    api.delete(f"/v1/jobs/{first.get_json()['id']}", headers=bearer("carol"))
    fourth = submit(api, "carol")
    assert fourth.status_code == 202
    for resp in (second, fourth):
        api.delete(f"/v1/jobs/{resp.get_json()['id']}", headers=bearer("carol"))


def test_priority_defaults_to_the_key_tier_and_cannot_exceed_it(api):
    job = submit(api, "bob").get_json()
    assert job["priority"] == "low"
    assert_error(submit(api, "bob", priority="high"), 403, "permission_denied")
    high = submit(api, "carol", priority="high").get_json()
    assert high["priority"] == "high"
    for who, j in (("bob", job), ("carol", high)):
        api.delete(f"/v1/jobs/{j['id']}", headers=bearer(who))


def test_key_entries_hold_hashes_only_and_are_checked(settings):
    assert set(k.id for k in load_keys(settings).values()) == {"alice", "bob", "carol"}
    key = parse_entry(f"dave:{hash_key('k').upper()}:tier=low:rpm=5:concurrent=1")
    assert (key.id, key.digest, key.tier, key.rpm, key.concurrent) == ("dave", hash_key("k"), "low", 5, 1)
    for bad in ("dave:plain-text-key", "dave", f"da ve:{hash_key('k')}", f"dave:{hash_key('k')}:tier=max",
                f"dave:{hash_key('k')}:rpm=-1"):
        with pytest.raises(KeyConfigError):
            parse_entry(bad)
    with pytest.raises(KeyConfigError):
        load_keys(make_settings(api_keys=f"x:{hash_key('a')},x:{hash_key('b')}"))


def test_cli_makes_a_key_whose_entry_authenticates_it():
    out = subprocess.run([sys.executable, "-m", "api.auth", "new", "erin", "tier=high"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    key = out.split("it is not stored): ")[1].split()[0]
    entry = out.split("keys file):")[1].split()[0]
    parsed = parse_entry(entry)
    assert parsed.id == "erin" and parsed.tier == "high" and parsed.digest == hash_key(key)
    assert key not in entry
