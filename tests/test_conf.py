import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from fairqueue import conf


@pytest.fixture(autouse=True)
def _fresh_settings():
    conf.reload_settings()
    yield
    conf.reload_settings()


def test_defaults(monkeypatch):
    for var in conf.ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    settings = conf.get_settings()
    assert settings.max_wait_ms == 300_000
    assert settings.rebalance_interval_ms == 5_000
    assert settings.priority_enabled is True
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.rebalance_window == 1_000
    assert settings.max_payload_bytes == 1_048_576


def test_env_var_wins_over_setting(monkeypatch):
    monkeypatch.setenv("QUEUE_FAIR_MAX_WAIT_MS", "1234")
    monkeypatch.setenv("JOB_PRIORITY_ENABLED", "false")
    with override_settings(FAIRQUEUE={"MAX_WAIT_MS": 99, "PRIORITY_ENABLED": True}):
        settings = conf.get_settings()
    assert settings.max_wait_ms == 1234
    assert settings.priority_enabled is False


def test_override_settings_clears_the_cache(monkeypatch):
    monkeypatch.delenv("QUEUE_FAIR_MAX_WAIT_MS", raising=False)
    with override_settings(FAIRQUEUE={"MAX_WAIT_MS": 42}):
        assert conf.get_settings().max_wait_ms == 42
    assert conf.get_settings().max_wait_ms == 300_000


@pytest.mark.parametrize(
    ("var", "value", "allowed"),
    [
        ("QUEUE_FAIR_MAX_WAIT_MS", "0", "1..86400000"),
        ("QUEUE_FAIR_MAX_WAIT_MS", "86400001", "1..86400000"),
        ("QUEUE_FAIR_MAX_WAIT_MS", "5m", "1..86400000"),
        ("QUEUE_FAIR_REBALANCE_INTERVAL_MS", "0", "1..3600000"),
        ("QUEUE_FAIR_REBALANCE_INTERVAL_MS", "3600001", "1..3600000"),
        ("JOB_PRIORITY_ENABLED", "maybe", "true or false"),
        ("FAIRQUEUE_MAX_PAYLOAD_BYTES", "1023", "1024..536870912"),
        ("FAIRQUEUE_MAX_PAYLOAD_BYTES", "536870913", "1024..536870912"),
        ("FAIRQUEUE_MAX_PAYLOAD_BYTES", "1MiB", "1024..536870912"),
    ],
)
def test_bad_env_value__improperly_configured_names_variable_value_and_range(
    monkeypatch, var, value, allowed
):
    monkeypatch.setenv(var, value)
    with pytest.raises(ImproperlyConfigured) as info:
        conf.get_settings()
    assert f"{var}={value!r}" in str(info.value)
    assert allowed in str(info.value)


def test_bad_redis_url__message_does_not_echo_the_url(monkeypatch):
    monkeypatch.setenv("FAIRQUEUE_REDIS_URL", "http://user:hunter2@host/0")
    with pytest.raises(ImproperlyConfigured) as info:
        conf.get_settings()
    assert "FAIRQUEUE_REDIS_URL" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_settings_repr_hides_redis_credentials(monkeypatch):
    monkeypatch.setenv("FAIRQUEUE_REDIS_URL", "redis://:hunter2@127.0.0.1:6379/0")
    assert "hunter2" not in repr(conf.get_settings())


@pytest.mark.parametrize(
    ("url", "location"),
    [
        ("redis://:hunter2@redis.internal:6380/3", "redis.internal:6380/3"),
        ("rediss://user:hunter2@10.0.0.5", "10.0.0.5:6379/0"),
        ("redis://127.0.0.1:6379/0", "127.0.0.1:6379/0"),
        ("unix:///run/redis.sock?db=2&password=hunter2", "unix:/run/redis.sock/2"),
    ],
)
def test_redis_location__host_port_db_and_never_the_password(monkeypatch, url, location):
    monkeypatch.setenv("FAIRQUEUE_REDIS_URL", url)
    assert conf.get_settings().redis_location == location
    assert conf.redis_location(url) == location


@pytest.mark.parametrize(
    "fairqueue",
    [
        {"MAX_WAIT_MS": True},
        {"REBALANCE_WINDOW": 0},
        {"MAX_PAYLOAD_BYTES": 1023},
        {"MAX_PAYLOAD_BYTES": 2048.0},
        {"QUEUES": {}},
        {"QUEUES": {"email": "bad:name"}},
        {"NO_SUCH_KEY": 1},
    ],
)
def test_bad_setting_values_are_rejected(monkeypatch, fairqueue):
    for var in conf.ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    with override_settings(FAIRQUEUE=fairqueue), pytest.raises(ImproperlyConfigured):
        conf.get_settings()


def test_system_check__flags_zero_max_wait(monkeypatch):
    monkeypatch.setenv("QUEUE_FAIR_MAX_WAIT_MS", "0")
    errors = [e for e in run_checks() if e.id == "fairqueue.E001"]
    assert len(errors) == 1
    assert "QUEUE_FAIR_MAX_WAIT_MS='0'" in errors[0].msg


def test_system_check__clean_settings_pass(monkeypatch):
    for var in conf.ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    assert [e for e in run_checks() if e.id.startswith("fairqueue.")] == []


@pytest.mark.parametrize(("value", "expected"), [(1_024, 1_024), (536_870_912, 536_870_912)])
def test_max_payload_bytes__range_ends_are_allowed(monkeypatch, value, expected):
    monkeypatch.delenv("FAIRQUEUE_MAX_PAYLOAD_BYTES", raising=False)
    with override_settings(FAIRQUEUE={"MAX_PAYLOAD_BYTES": value}):
        assert conf.get_settings().max_payload_bytes == expected


def test_max_payload_bytes__env_var_wins_over_setting(monkeypatch):
    monkeypatch.setenv("FAIRQUEUE_MAX_PAYLOAD_BYTES", "65536")
    with override_settings(FAIRQUEUE={"MAX_PAYLOAD_BYTES": 2048}):
        assert conf.get_settings().max_payload_bytes == 65_536


def test_max_payload_bytes__bad_setting_names_key_value_and_range(monkeypatch):
    monkeypatch.delenv("FAIRQUEUE_MAX_PAYLOAD_BYTES", raising=False)
    with (
        override_settings(FAIRQUEUE={"MAX_PAYLOAD_BYTES": 10}),
        pytest.raises(ImproperlyConfigured) as info,
    ):
        conf.get_settings()
    assert "FAIRQUEUE['MAX_PAYLOAD_BYTES']=10 is not allowed" in str(info.value)
    assert "1024..536870912" in str(info.value)


def test_system_check__flags_out_of_range_max_payload_bytes(monkeypatch):
    monkeypatch.setenv("FAIRQUEUE_MAX_PAYLOAD_BYTES", "100")
    errors = [e for e in run_checks() if e.id == "fairqueue.E001"]
    assert len(errors) == 1
    assert "FAIRQUEUE_MAX_PAYLOAD_BYTES='100'" in errors[0].msg
