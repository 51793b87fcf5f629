"""FAIRQUEUE['REDIS']: a URL, Sentinel or Cluster, validated with errors that name the
setting and never print a password; REDIS_URL and FAIRQUEUE_REDIS_URL keep working."""

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from fairqueue import conf
from fairqueue.redis_target import hash_tag, parse_redis_target, queue_hash_tag


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch):
    monkeypatch.delenv("FAIRQUEUE_REDIS_URL", raising=False)
    conf.reload_settings()
    yield
    conf.reload_settings()


def test_a_url_is_one_server():
    target = parse_redis_target("redis://:s3cret@10.0.0.1:6380/2")
    assert target.kind == "url" and target.url == "redis://:s3cret@10.0.0.1:6380/2"
    assert target.location == "10.0.0.1:6380/2"
    assert "s3cret" not in repr(target)
    assert parse_redis_target({"url": "unix:///tmp/r.sock?db=3"}).location == "unix:/tmp/r.sock/3"


def test_sentinel_dict_and_url_are_the_same_target():
    from_dict = parse_redis_target(
        {
            "sentinel": ["10.0.0.1:26379", ("10.0.0.2", 26380), "[::1]:26381"],
            "service": "mymaster",
            "db": 3,
            "password": "p@ss:word",
            "sentinel_password": "s-pass",
        }
    )
    assert from_dict.kind == "sentinel" and from_dict.service == "mymaster"
    assert from_dict.nodes == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 26381))
    assert from_dict.db == 3 and from_dict.password == "p@ss:word"
    from_url = parse_redis_target(from_dict.url)  # the env-var form round-trips
    assert from_url == from_dict
    assert from_dict.location == (
        "sentinel mymaster via 10.0.0.1:26379,10.0.0.2:26380,[::1]:26381 (db 3)"
    )
    for secret in ("p@ss", "s-pass"):
        assert secret not in repr(from_dict) and secret not in from_dict.location
    short = parse_redis_target("redis+sentinel://127.0.0.1:26379/mymaster")
    assert (short.db, short.password, short.ssl) == (0, None, False)


def test_cluster_dict_and_url_are_the_same_target():
    target = parse_redis_target({"cluster": ["127.0.0.1:7001", "127.0.0.1:7002"], "ssl": True})
    assert target.kind == "cluster" and target.url == (
        "rediss+cluster://127.0.0.1:7001,127.0.0.1:7002"
    )
    assert parse_redis_target(target.url) == target
    assert target.location == "cluster via 127.0.0.1:7001,127.0.0.1:7002"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://:hunter2@h/0", "expected a redis://, rediss:// or unix:// URL"),
        (42, "expected a redis://"),
        ({"sentinel": ["h:1"], "cluster": ["h:2"]}, "a dict with one of the keys"),
        ({"sentinel": ["h:1"]}, r"\['service'\]=None is not allowed"),
        ({"sentinel": [], "service": "m"}, "expected a non-empty list"),
        ({"sentinel": ["h:99999"], "service": "m"}, r"'h:99999' is not allowed.*1\.\.65535"),
        ({"sentinel": ["nohost"], "service": "m"}, "expected 'host:port'"),
        ({"sentinel": ["h:1"], "service": "m", "db": -1}, "db -1 is not allowed"),
        ({"cluster": ["h:1"], "service": "m"}, r"unknown keys \['service'\]"),
        ({"cluster": ["h:1"], "password": 5}, r"\['password'\] is not allowed"),
        ("redis+cluster://h:1/2", "takes no path"),
        ("redis+sentinel://h:1/m?x=1", r"unknown URL options \['x'\]"),
        ("redis+sentinel://:hunter2@h:1", r"\['service'\]=None"),
    ],
)
def test_bad_redis_setting__error_names_it_and_never_the_password(value, message):
    with pytest.raises(ImproperlyConfigured, match=message) as info:
        parse_redis_target(value)
    assert "FAIRQUEUE['REDIS']" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_settings__redis_wins_and_redis_url_still_works(monkeypatch):
    with override_settings(FAIRQUEUE={"REDIS_URL": "redis://127.0.0.1:6390/1"}):
        settings = conf.load_settings()
        assert settings.redis.kind == "url" and settings.redis_location == "127.0.0.1:6390/1"
    with override_settings(FAIRQUEUE={"REDIS": {"sentinel": ["127.0.0.1:26379"], "service": "m"}}):
        settings = conf.load_settings()
        assert settings.redis.kind == "sentinel"
        assert settings.redis_url == "redis+sentinel://127.0.0.1:26379/m/0"
        assert settings.redis_location == "sentinel m via 127.0.0.1:26379 (db 0)"
    monkeypatch.setenv("FAIRQUEUE_REDIS_URL", "redis+cluster://127.0.0.1:7001")
    with override_settings(
        FAIRQUEUE={"REDIS": "redis://127.0.0.1:6390/1", "QUEUES": {"email": "{email}"}}
    ):
        assert conf.load_settings().redis.kind == "cluster"  # the environment wins


def test_settings__redis_and_redis_url_together_is_an_error():
    with override_settings(
        FAIRQUEUE={"REDIS": "redis://127.0.0.1:6379/0", "REDIS_URL": "redis://127.0.0.1:6379/1"}
    ):
        errors = [e for e in run_checks() if e.id == "fairqueue.E015"]
    assert len(errors) == 1 and "both 'REDIS' and 'REDIS_URL'" in errors[0].msg


def test_check__bad_sentinel_setting_is_reported_without_the_password():
    with override_settings(
        FAIRQUEUE={"REDIS": {"sentinel": ["127.0.0.1:0"], "service": "m", "password": "pw-x"}}
    ):
        errors = [e for e in run_checks() if e.id == "fairqueue.E004"]
    assert len(errors) == 1 and "FAIRQUEUE['REDIS'] address" in errors[0].msg
    assert "pw-x" not in errors[0].msg


def test_env_var_takes_sentinel_url_and_names_itself_on_error(monkeypatch):
    monkeypatch.setenv("FAIRQUEUE_REDIS_URL", "redis+sentinel://:pw@127.0.0.1:26379")
    with pytest.raises(ImproperlyConfigured, match="FAIRQUEUE_REDIS_URL") as info:
        conf.load_settings()
    assert "pw" not in str(info.value).replace("password", "")


def test_hash_tags():
    assert hash_tag("bull:{email}:fq:ready:17") == "email"
    assert hash_tag("bull:{}:x") is None and hash_tag("bull:email") is None
    assert queue_hash_tag("bull", "{email}") == "email"
    assert queue_hash_tag("{bull}", "email") == "bull"
    assert queue_hash_tag("bull", "email") is None
    # a tag that only a job id could close does not count
    assert queue_hash_tag("bull", "{email") is None
