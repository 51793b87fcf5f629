import os
import subprocess
import sys
from pathlib import Path

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


def test_defaults(monkeypatch, settings):
    for var in conf.ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    settings.FAIRQUEUE = {"QUEUES": {"email": "email"}}  # the suite's own sets REDIS_URL
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
    errors = [e for e in run_checks() if e.id == "fairqueue.E012"]
    assert len(errors) == 1
    assert "FAIRQUEUE_MAX_PAYLOAD_BYTES='100'" in errors[0].msg


# -- hardening: env vars take ASCII digits only; check reports, never crashes --------

NUMERIC_ENV_VARS = [
    ("QUEUE_FAIR_MAX_WAIT_MS", "1..86400000"),
    ("QUEUE_FAIR_REBALANCE_INTERVAL_MS", "1..3600000"),
    ("QUEUE_FAIR_REBALANCE_WINDOW", "1..100000"),
    ("FAIRQUEUE_MAX_PAYLOAD_BYTES", "1024..536870912"),
    ("FAIRQUEUE_KEEP_COMPLETED_COUNT", "0..100000000"),
    ("FAIRQUEUE_KEEP_COMPLETED_AGE_S", "1..315360000"),
    ("FAIRQUEUE_KEEP_FAILED_COUNT", "0..100000000"),
    ("FAIRQUEUE_KEEP_FAILED_AGE_S", "1..315360000"),
]
#: The check id of each variable's problem (docs/checks.md).
CHECK_IDS = {
    "QUEUE_FAIR_MAX_WAIT_MS": "fairqueue.E001",
    "QUEUE_FAIR_REBALANCE_INTERVAL_MS": "fairqueue.E002",
    "QUEUE_FAIR_REBALANCE_WINDOW": "fairqueue.E007",
    "FAIRQUEUE_MAX_PAYLOAD_BYTES": "fairqueue.E012",
    "FAIRQUEUE_KEEP_COMPLETED_COUNT": "fairqueue.E013",
    "FAIRQUEUE_KEEP_COMPLETED_AGE_S": "fairqueue.E013",
    "FAIRQUEUE_KEEP_FAILED_COUNT": "fairqueue.E014",
    "FAIRQUEUE_KEEP_FAILED_AGE_S": "fairqueue.E014",
}
BAD_NUMBERS = ["--5", "²", "٣", "", " ", "+5", "-5", "5.0", "1e3", "0x10", "5 5", "1" * 13]


@pytest.fixture
def clean_env(monkeypatch):
    for var in [*conf.ENV_VARS.values(), *conf.RETENTION_ENV_VARS.values()]:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize(("var", "allowed"), NUMERIC_ENV_VARS)
@pytest.mark.parametrize("value", BAD_NUMBERS)
def test_env_int__only_ascii_digits_named_error_and_check_reports_it(
    clean_env, var, allowed, value
):
    clean_env.setenv(var, value)
    with pytest.raises(ImproperlyConfigured) as info:
        conf.get_settings()
    message = str(info.value)
    assert f"{var}={value.strip()!r} is not allowed" in message and allowed in message
    errors = [e for e in run_checks() if e.id == CHECK_IDS[var]]
    assert len(errors) == 1 and var in errors[0].msg


def test_env_int__empty_value_says_to_unset_the_variable(clean_env):
    clean_env.setenv("QUEUE_FAIR_MAX_WAIT_MS", "")
    with pytest.raises(ImproperlyConfigured, match="unset the variable for the default"):
        conf.get_settings()


@pytest.mark.parametrize("var", ["JOB_PRIORITY_ENABLED", "FAIRQUEUE_PREFIX", "FAIRQUEUE_REDIS_URL"])
def test_env_empty__other_variables_refuse_it_too(clean_env, var):
    clean_env.setenv(var, "")
    with pytest.raises(ImproperlyConfigured, match=var):
        conf.get_settings()


def test_env_int__ascii_digits_with_surrounding_spaces_are_fine(clean_env):
    clean_env.setenv("QUEUE_FAIR_MAX_WAIT_MS", " 1234 ")
    assert conf.get_settings().max_wait_ms == 1234


def test_manage_py_check__bad_env_var_is_a_check_error_not_a_traceback():
    env = {
        **os.environ,
        "QUEUE_FAIR_MAX_WAIT_MS": "--5",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "fairqueue.E001" in done.stderr and "QUEUE_FAIR_MAX_WAIT_MS='--5'" in done.stderr
    assert "Traceback" not in done.stderr


# -- hardening: the Redis URL is validated, never printed -----------------------------


@pytest.mark.parametrize(
    ("url", "part"),
    [
        ("redis://:hunter2@127.0.0.1:0/0", "port '0'"),
        ("redis://:hunter2@127.0.0.1:65536/0", "port '65536'"),
        ("redis://:hunter2@127.0.0.1:99999999/0", "port"),
        ("redis://:hunter2@127.0.0.1:²/0", "port"),
        ("redis://:hunter2@127.0.0.1:6379/x", "database 'x'"),
        ("redis://:hunter2@127.0.0.1:6379/16000", "database '16000'"),
        ("redis://:hunter2@127.0.0.1:6379/٣", "database"),
        ("redis://:hunter2@/0", "no host"),
        ("unix://:hunter2@", "socket's path"),
        ("http://:hunter2@127.0.0.1:6379/0", "expected a redis://"),
    ],
)
def test_redis_url__check_names_the_setting_and_part_never_the_password(clean_env, url, part):
    clean_env.setenv("FAIRQUEUE_REDIS_URL", url)
    errors = [e for e in run_checks() if e.id == "fairqueue.E004"]
    assert len(errors) == 1
    assert "FAIRQUEUE_REDIS_URL" in errors[0].msg and part in errors[0].msg
    assert "hunter2" not in errors[0].msg
    clean_env.delenv("FAIRQUEUE_REDIS_URL")
    with override_settings(FAIRQUEUE={"REDIS_URL": url}):
        errors = [e for e in run_checks() if e.id == "fairqueue.E004"]
    assert len(errors) == 1 and "FAIRQUEUE['REDIS_URL']" in errors[0].msg
    assert "hunter2" not in errors[0].msg


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://127.0.0.1",
        "rediss://user:pw@redis.example:6380/15",
        "redis://[::1]:6379/2",
        "redis://127.0.0.1:6379?db=3",
        "unix:///run/redis.sock?db=2",
    ],
)
def test_redis_url__good_urls_pass_check(clean_env, url):
    clean_env.setenv("FAIRQUEUE_REDIS_URL", url)
    assert [e for e in run_checks() if e.id == "fairqueue.E004"] == []


# -- retention ---------------------------------------------------------------------------


def test_retention__defaults_1000_jobs_a_day_and_5000_failed_a_week(clean_env):
    settings = conf.get_settings()
    assert settings.keep_completed == conf.Retention(count=1_000, age_s=86_400)
    assert settings.keep_failed == conf.Retention(count=5_000, age_s=604_800)
    assert settings.keep_completed.bullmq_option() == {"count": 1_000, "age": 86_400}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        (0, {"count": 0}),
        (50, {"count": 50}),
        ({"age": 3600}, {"age": 3600}),
        ({"count": 10, "age": 60}, {"count": 10, "age": 60}),
        ({"count": None, "age": 60}, {"age": 60}),
    ],
)
def test_retention__forms_become_bullmq_options(clean_env, value, expected):
    with override_settings(FAIRQUEUE={"KEEP_COMPLETED": value, "KEEP_FAILED": value}):
        settings = conf.get_settings()
    assert settings.keep_completed.bullmq_option() == expected
    assert settings.keep_failed.bullmq_option() == expected


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (-1, "FAIRQUEUE['KEEP_COMPLETED']['count']=-1"),
        (True, "FAIRQUEUE['KEEP_COMPLETED']=True"),
        ("100", "FAIRQUEUE['KEEP_COMPLETED']='100'"),
        ({}, "FAIRQUEUE['KEEP_COMPLETED']={}"),
        ({"count": 5, "days": 1}, "FAIRQUEUE['KEEP_COMPLETED']="),
        ({"age": 0}, "FAIRQUEUE['KEEP_COMPLETED']['age']=0"),
        ({"count": 1.5}, "FAIRQUEUE['KEEP_COMPLETED']['count']=1.5"),
    ],
)
def test_retention__bad_values_named(clean_env, value, named):
    with (
        override_settings(FAIRQUEUE={"KEEP_COMPLETED": value}),
        pytest.raises(ImproperlyConfigured) as info,
    ):
        conf.get_settings()
    assert named in str(info.value)


def test_retention__env_vars_override_one_field_each(clean_env):
    clean_env.setenv("FAIRQUEUE_KEEP_COMPLETED_COUNT", "7")
    clean_env.setenv("FAIRQUEUE_KEEP_FAILED_AGE_S", "120")
    settings = conf.get_settings()
    assert settings.keep_completed == conf.Retention(count=7, age_s=86_400)
    assert settings.keep_failed == conf.Retention(count=5_000, age_s=120)
