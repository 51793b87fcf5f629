"""System checks: one stable id per problem, its exact message and hint, every problem
reported in one run, the message the same as the ImproperlyConfigured of first use, and
never a crash of `manage.py check`."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import Error, Tags, Warning, run_checks
from django.core.exceptions import ImproperlyConfigured

try:  # Django 6
    from django.tasks import task_backends
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task_backends

from fairqueue import checks, conf
from fairqueue.conf import Problem

DOCS = Path(__file__).resolve().parents[2] / "docs" / "checks.md"
ALLOWED_KEYS = (
    "['AUDIT_EXPLICIT_PRIORITY', 'BREAKER', 'CACHE_ALIAS', 'FAIRNESS_BY', 'KEEP_COMPLETED', "
    "'KEEP_FAILED', 'MAX_PAYLOAD_BYTES', 'MAX_WAIT_MS', 'PLAN_CACHE_TIMEOUT', "
    "'PLAN_LOCAL_CACHE_TIMEOUT', 'PREFIX', 'PRIORITY_ENABLED', 'QUEUES', 'QUOTAS', "
    "'REBALANCE_INTERVAL_MS', 'REBALANCE_WINDOW', 'REDIS', 'REDIS_URL', 'TENANT_LIMITS', "
    "'USAGE_LEDGER']"
)
CLUSTER = {"cluster": ["127.0.0.1:7001"]}
TENANT_LIMITS_HINT = (
    'Map plan tiers to limits, e.g. {"free": {"max_active": 2, "rate_max": 10, '
    '"rate_duration_ms": 60000}}; each limit a whole number or None.'
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in [*conf.ENV_VARS.values(), *conf.RETENTION_ENV_VARS.values()]:
        monkeypatch.delenv(var, raising=False)
    conf.reload_settings()
    yield monkeypatch
    conf.reload_settings()


def configure(settings, monkeypatch, fairqueue: Any, env: Mapping[str, str]) -> None:
    settings.FAIRQUEUE = fairqueue
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    conf.reload_settings()


# id, FAIRQUEUE, environment, message, hint
SETTING_CASES = [
    (
        "fairqueue.E001",
        {},
        {"QUEUE_FAIR_MAX_WAIT_MS": "0"},
        "QUEUE_FAIR_MAX_WAIT_MS='0' is not allowed: expected an integer in 1..86400000 "
        "(ASCII digits)",
        "Set QUEUE_FAIR_MAX_WAIT_MS or FAIRQUEUE['MAX_WAIT_MS'] (the variable wins) to a "
        "number of milliseconds in 1..86400000 (ASCII digits in the variable), or remove it "
        "for the default 300000.",
    ),
    (
        "fairqueue.E002",
        {"REBALANCE_INTERVAL_MS": 0},
        {},
        "FAIRQUEUE['REBALANCE_INTERVAL_MS']=0 is not allowed: expected an integer in "
        "1..3600000 (ASCII digits)",
        "Set QUEUE_FAIR_REBALANCE_INTERVAL_MS or FAIRQUEUE['REBALANCE_INTERVAL_MS'] (the "
        "variable wins) to a number of milliseconds in 1..3600000 (ASCII digits in the "
        "variable), or remove it for the default 5000.",
    ),
    (
        "fairqueue.E003",
        {},
        {"JOB_PRIORITY_ENABLED": "maybe"},
        "JOB_PRIORITY_ENABLED='maybe' is not allowed: expected true or false",
        "Set JOB_PRIORITY_ENABLED or FAIRQUEUE['PRIORITY_ENABLED'] (the variable wins) to "
        "true or false (or 1/0, yes/no, on/off), or remove it for the default True.",
    ),
    (
        "fairqueue.E004",
        {},
        {"FAIRQUEUE_REDIS_URL": "redis://:hunter2@127.0.0.1:0/0"},
        "FAIRQUEUE_REDIS_URL is not allowed: port '0' is not in 1..65535",
        "Fix the part the message names in FAIRQUEUE_REDIS_URL (it wins), FAIRQUEUE['REDIS'] "
        "or FAIRQUEUE['REDIS_URL']: a redis://host:port/db URL (or rediss://, unix://), a "
        "redis+sentinel:// or redis+cluster:// URL, or a dict with 'url', 'sentinel' (and "
        "'service') or 'cluster'.",
    ),
    (
        "fairqueue.E005",
        {"PREFIX": "bull:eu"},
        {},
        "FAIRQUEUE['PREFIX']='bull:eu' is not allowed: expected a non-empty string without ':'",
        "Set FAIRQUEUE_PREFIX or FAIRQUEUE['PREFIX'] (the variable wins) to the BullMQ key "
        "prefix your workers use, a non-empty string without ':', or remove it for BullMQ's "
        "default 'bull'.",
    ),
    (
        "fairqueue.E006",
        {"QUEUES": {"email": "bad:name"}},
        {},
        "FAIRQUEUE['QUEUES'] queue name 'bad:name' is not allowed: expected a non-empty "
        "string of at most 200 characters without ':'",
        "Map each job type to its BullMQ queue name, both non-empty strings of at most 200 "
        "characters without ':', e.g. FAIRQUEUE['QUEUES'] = {'email': 'email'}.",
    ),
    (
        "fairqueue.E007",
        {},
        {"QUEUE_FAIR_REBALANCE_WINDOW": "100001"},
        "QUEUE_FAIR_REBALANCE_WINDOW='100001' is not allowed: expected an integer in "
        "1..100000 (ASCII digits)",
        "Set QUEUE_FAIR_REBALANCE_WINDOW or FAIRQUEUE['REBALANCE_WINDOW'] (the variable "
        "wins) to a number of jobs in 1..100000 (ASCII digits in the variable), or remove it "
        "for the default 1000.",
    ),
    (
        "fairqueue.E008",
        {"CACHE_ALIAS": ""},
        {},
        "FAIRQUEUE['CACHE_ALIAS']='' is not allowed: expected a non-empty string without ':'",
        "Set FAIRQUEUE['CACHE_ALIAS'] to the alias of a cache in CACHES (a non-empty string "
        "without ':'), or remove it for 'default'.",
    ),
    (
        "fairqueue.E009",
        {"PLAN_CACHE_TIMEOUT": 86_401},
        {},
        "FAIRQUEUE['PLAN_CACHE_TIMEOUT']=86401 is not allowed: expected an integer in "
        "0..86400 (ASCII digits)",
        "Set FAIRQUEUE['PLAN_CACHE_TIMEOUT'] to a number of seconds in 0..86400, or remove "
        "it for the default 300.",
    ),
    (
        "fairqueue.E012",
        {},
        {"FAIRQUEUE_MAX_PAYLOAD_BYTES": "1MiB"},
        "FAIRQUEUE_MAX_PAYLOAD_BYTES='1MiB' is not allowed: expected an integer in "
        "1024..536870912 (ASCII digits)",
        "Set FAIRQUEUE_MAX_PAYLOAD_BYTES or FAIRQUEUE['MAX_PAYLOAD_BYTES'] (the variable "
        "wins) to a number of bytes in 1024..536870912 (ASCII digits in the variable), or "
        "remove it for the default 1048576.",
    ),
    (
        "fairqueue.E021",
        {"FAIRNESS_BY": "seconds"},
        {},
        "FAIRQUEUE['FAIRNESS_BY']='seconds' is not allowed: expected 'time' or 'jobs'",
        "Set FAIRQUEUE['FAIRNESS_BY'] to 'time' (service is the workers' time, the "
        "default) or 'jobs' (service is the number of jobs), or remove it.",
    ),
    (
        "fairqueue.E013",
        {"KEEP_COMPLETED": {"count": 5, "days": 1}},
        {},
        "FAIRQUEUE['KEEP_COMPLETED']={'count': 5, 'days': 1} is not allowed: expected None "
        '(keep every job), a count of jobs, or a dict with "count" and/or "age" (seconds)',
        "Set FAIRQUEUE['KEEP_COMPLETED'] to None (keep every job), a count of jobs in "
        "0..100000000, or a dict with 'count' and/or 'age' (seconds in 1..315360000); "
        "FAIRQUEUE_KEEP_COMPLETED_COUNT and FAIRQUEUE_KEEP_COMPLETED_AGE_S override one field "
        "each.",
    ),
    (
        "fairqueue.E014",
        {},
        {"FAIRQUEUE_KEEP_FAILED_AGE_S": "0"},
        "FAIRQUEUE_KEEP_FAILED_AGE_S='0' is not allowed: expected an integer in 1..315360000 "
        "(ASCII digits)",
        "Set FAIRQUEUE['KEEP_FAILED'] to None (keep every job), a count of jobs in "
        "0..100000000, or a dict with 'count' and/or 'age' (seconds in 1..315360000); "
        "FAIRQUEUE_KEEP_FAILED_COUNT and FAIRQUEUE_KEEP_FAILED_AGE_S override one field each.",
    ),
    (
        "fairqueue.E015",
        {"REDIS": "redis://127.0.0.1:6379/0", "REDIS_URL": "redis://127.0.0.1:6379/1"},
        {},
        "FAIRQUEUE sets both 'REDIS' and 'REDIS_URL': set only one ('REDIS' takes a URL too)",
        "Keep FAIRQUEUE['REDIS'] and remove FAIRQUEUE['REDIS_URL'] (REDIS takes the same URLs).",
    ),
    (
        "fairqueue.E016",
        {"REDIS": CLUSTER, "QUEUES": {"email": "email"}},
        {},
        "FAIRQUEUE['QUEUES'] queue name 'email' is not allowed on a Redis Cluster: expected a "
        "hash tag, e.g. '{email}', so all of the queue's keys (BullMQ's and fairqueue's) "
        "share one slot (workers, Node ones too, must use the same queue name)",
        "Name every queue with a hash tag, e.g. FAIRQUEUE['QUEUES'] = {'email': '{email}'}, "
        "and give workers the same queue name.",
    ),
    (
        "fairqueue.E017",
        ["QUEUES"],
        {},
        "FAIRQUEUE=['QUEUES'] is not allowed: expected a dict of fairqueue settings",
        "Set FAIRQUEUE to a dict of fairqueue settings, e.g. FAIRQUEUE = {'QUEUES': "
        "{'email': 'email'}}, or remove it for the defaults.",
    ),
    (
        "fairqueue.E018",
        {"MAX_WAIT": 5, "QUEUES": {"email": "email"}},
        {},
        f"FAIRQUEUE has unknown keys ['MAX_WAIT']: allowed keys are {ALLOWED_KEYS}",
        "Remove the unknown keys from FAIRQUEUE or correct their spelling.",
    ),
    (
        "fairqueue.E022",
        {"AUDIT_EXPLICIT_PRIORITY": "sometimes"},
        {},
        "FAIRQUEUE['AUDIT_EXPLICIT_PRIORITY']='sometimes' is not allowed: expected true or false",
        "Set FAIRQUEUE['AUDIT_EXPLICIT_PRIORITY'] to True or False, or remove it for the "
        "default False (only priority_override= is audited).",
    ),
    (
        "fairqueue.E023",
        {"PLAN_LOCAL_CACHE_TIMEOUT": 3_601},
        {},
        "FAIRQUEUE['PLAN_LOCAL_CACHE_TIMEOUT']=3601 is not allowed: expected an integer in "
        "0..3600 (ASCII digits)",
        "Set FAIRQUEUE['PLAN_LOCAL_CACHE_TIMEOUT'] to a number of seconds in 0..3600, or "
        "remove it for the default 10.",
    ),
    (
        "fairqueue.E024",
        {"TENANT_LIMITS": {"free": {"max_active": 0}}},
        {},
        "FAIRQUEUE['TENANT_LIMITS']['free']['max_active']=0 is not allowed: expected a whole "
        "number in 1..1000000 or None for no limit",
        TENANT_LIMITS_HINT,
    ),
    (
        "fairqueue.E026",
        {"USAGE_LEDGER": "maybe"},
        {},
        "FAIRQUEUE['USAGE_LEDGER']='maybe' is not allowed: expected true or false",
        "Set FAIRQUEUE['USAGE_LEDGER'] to True (count usage, the default) or False.",
    ),
    (
        "fairqueue.E027",
        {"QUOTAS": {"free": {"worker_seconds": 60, "action": "throttle"}}},
        {},
        "FAIRQUEUE['QUOTAS']['free']['action']='throttle' is not allowed: expected 'demote' "
        "(its jobs run at low until the period ends) or 'hold' (held until the period ends)",
        'Map plan tiers to quotas, e.g. {"free": {"worker_seconds": 3600, "period": '
        '"day", "action": "hold"}}; period "day" or "month", action "demote" or "hold".',
    ),
    (
        "fairqueue.E028",
        {"BREAKER": {"FAILURE_RATIO": 1.5}},
        {},
        "FAIRQUEUE['BREAKER']['FAILURE_RATIO']=1.5 is not allowed: expected a number in 0.01..1",
        'Set FAIRQUEUE[\'BREAKER\'] to a dict such as {"ENABLED": True, "WINDOW_S": 60, '
        '"MIN_JOBS": 20, "FAILURE_RATIO": 0.95, "COOL_OFF_S": 300}, or remove it.',
    ),
]


@pytest.mark.parametrize(
    ("check_id", "fairqueue", "env", "message", "hint"),
    SETTING_CASES,
    ids=[case[0] for case in SETTING_CASES],
)
def test_each_problem__its_own_id_exact_message_and_hint_and_the_same_runtime_error(
    settings, clean_env, check_id, fairqueue, env, message, hint
):
    configure(settings, clean_env, fairqueue, env)
    assert checks.check_settings() == [Error(message, hint=hint, id=check_id)]
    with pytest.raises(ImproperlyConfigured) as info:
        conf.get_settings()
    assert str(info.value) == message
    assert "hunter2" not in message


def test_registered__run_checks_reports_the_settings_error(settings, clean_env, db):
    configure(settings, clean_env, {"QUEUES": {"email": "email"}}, {"QUEUE_FAIR_MAX_WAIT_MS": "0"})
    found = [m for m in run_checks() if m.id == "fairqueue.E001"]
    assert found == checks.check_settings()


def test_several_problems__all_reported_in_one_run_and_first_use_raises_the_first(
    settings, clean_env
):
    configure(
        settings,
        clean_env,
        {"NO_SUCH_KEY": 1, "PREFIX": "", "QUEUES": {"email": "email"}, "KEEP_FAILED": -1},
        {"QUEUE_FAIR_MAX_WAIT_MS": "5m", "JOB_PRIORITY_ENABLED": "maybe"},
    )
    errors = checks.check_settings()
    assert [e.id for e in errors] == [
        "fairqueue.E018",
        "fairqueue.E005",
        "fairqueue.E001",
        "fairqueue.E003",
        "fairqueue.E014",
    ]
    assert "['NO_SUCH_KEY']" in errors[0].msg
    assert errors[3].msg == "JOB_PRIORITY_ENABLED='maybe' is not allowed: expected true or false"
    with pytest.raises(ImproperlyConfigured) as info:
        conf.get_settings()
    assert str(info.value) == errors[0].msg


def test_not_a_dict__the_environment_is_still_checked(settings, clean_env):
    configure(settings, clean_env, "email", {"QUEUE_FAIR_REBALANCE_INTERVAL_MS": "0"})
    assert [e.id for e in checks.check_settings()] == ["fairqueue.E017", "fairqueue.E002"]


def test_cluster_hash_tags__not_judged_while_the_queues_themselves_are_bad(settings, clean_env):
    configure(settings, clean_env, {"REDIS": CLUSTER, "QUEUES": {"email": ""}}, {})
    assert [e.id for e in checks.check_settings()] == ["fairqueue.E006"]


def test_a_redis_error__is_e004_whichever_setting_carries_it(settings, clean_env):
    configure(
        settings, clean_env, {"REDIS": {"sentinel": ["h:1"], "service": "m", "db": 99999}}, {}
    )
    errors = checks.check_settings()
    assert [(e.id, e.msg) for e in errors] == [
        (
            "fairqueue.E004",
            "FAIRQUEUE['REDIS'] db 99999 is not allowed: expected a database number 0..15999",
        )
    ]
    configure(settings, clean_env, {"REDIS_URL": "http://127.0.0.1"}, {})
    assert [e.id for e in checks.check_settings()] == ["fairqueue.E004"]


class ExplodingMapping(Mapping):
    """A FAIRQUEUE that fails when read, with a secret in the exception's text."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("redis://:hunter2@db")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("redis://:hunter2@db")

    def __len__(self) -> int:
        return 1


def test_unexpected_exception__e019_names_only_its_type_and_never_crashes(settings, clean_env, db):
    configure(settings, clean_env, ExplodingMapping(), {})
    expected = Error(
        "fairqueue settings could not be checked: RuntimeError was raised while reading them",
        hint="Call fairqueue.conf.load_settings() in `manage.py shell` for the traceback; "
        "check FAIRQUEUE and the QUEUE_FAIR_*, JOB_PRIORITY_ENABLED and FAIRQUEUE_* "
        "environment variables.",
        id="fairqueue.E019",
    )
    assert checks.check_settings() == [expected]
    assert checks.check_cluster_slots() == []  # reported once, by check_settings
    # The tag fairqueue registers its settings checks under (django-tasks' backend check,
    # untagged, reads the settings on its own).
    assert [m for m in run_checks(tags=[Tags.compatibility]) if m.id == "fairqueue.E019"] == [
        expected
    ]
    with pytest.raises(RuntimeError):  # first use raises the exception itself
        conf.get_settings()


def test_w011__a_hash_tag_in_the_prefix(settings, clean_env):
    configure(
        settings,
        clean_env,
        {"REDIS": CLUSTER, "PREFIX": "{bull}", "QUEUES": {"email": "email", "report": "report"}},
        {},
    )
    assert checks.check_settings() == []
    assert checks.check_cluster_slots() == [
        Warning(
            "FAIRQUEUE['PREFIX']='{bull}' carries a hash tag, so every queue lives on one slot "
            "of the cluster",
            hint="Put the hash tag in each queue name instead (e.g. '{email}').",
            id="fairqueue.W011",
        )
    ]


def test_w011__two_queues_on_one_slot(settings, clean_env):
    configure(
        settings,
        clean_env,
        {"REDIS": CLUSTER, "QUEUES": {"email": "{a}x", "report": "{a}y", "cleanup": "{c}"}},
        {},
    )
    assert checks.check_cluster_slots() == [
        Warning(
            "FAIRQUEUE['QUEUES'] queues ['{a}x', '{a}y'] hash to the same cluster slot 15495, "
            "so they always share a master",
            hint="Give one of them a different hash tag to spread them over the cluster.",
            id="fairqueue.W011",
        )
    ]


def test_w011__silent_while_the_settings_have_errors(settings, clean_env):
    configure(
        settings,
        clean_env,
        {"REDIS": CLUSTER, "PREFIX": "{bull}", "QUEUES": {"email": "email", "report": "r"}},
        {"QUEUE_FAIR_MAX_WAIT_MS": "0"},
    )
    assert checks.check_cluster_slots() == []
    assert [e.id for e in checks.check_settings()] == ["fairqueue.E001"]


def test_e010__task_queue_without_a_job_type(settings, clean_env):
    configure(settings, clean_env, {"QUEUES": {"email": "email"}}, {})
    backend = task_backends["default"]
    assert [m for m in backend.check() if m.id.startswith("fairqueue.")] == [
        Error(
            "queue_name='report' is not allowed: expected a job type of FAIRQUEUE['QUEUES'] "
            "('email'), or a queue name mapped to one in TASKS['default']['OPTIONS']"
            "['JOB_TYPES']",
            hint="Add the job type to FAIRQUEUE['QUEUES'] or map the queue name.",
            obj=backend,
            id="fairqueue.E010",
        )
    ]


@pytest.mark.parametrize(
    "lookalike", ["FAIRQEUE", "FAIR_QUEUE", "FAIRQUEUES", "FAIRQUEUE_REDIS_URL"]
)
def test_w029__no_fairqueue_setting_names_the_lookalike(settings, clean_env, lookalike, db):
    del settings.FAIRQUEUE
    setattr(settings, lookalike, {"QUEUES": {"email": "email"}})
    conf.reload_settings()
    (warning,) = [m for m in run_checks() if m.id == checks.NO_SETTING_ID]
    assert isinstance(warning, Warning)
    assert f"found {lookalike}, which fairqueue does not read" in warning.msg
    assert warning.hint.startswith(f"Rename {lookalike} to FAIRQUEUE")


def test_w029__no_fairqueue_setting_and_no_lookalike(settings, clean_env, db):
    del settings.FAIRQUEUE
    conf.reload_settings()
    (warning,) = [m for m in run_checks() if m.id == checks.NO_SETTING_ID]
    assert "settings define no FAIRQUEUE" in warning.msg and "found" not in warning.msg
    assert warning.hint.startswith("Add FAIRQUEUE = ")


def test_w029__silent_once_fairqueue_is_set_even_empty(settings, clean_env):
    settings.FAIRQUEUE = {}
    settings.FAIRQEUE = {}
    conf.reload_settings()
    assert checks.check_setting_present() == []


def test_clean_settings__no_fairqueue_messages(settings, clean_env, db):
    configure(settings, clean_env, {"QUEUES": {"email": "email", "report": "report"}}, {})
    assert [m for m in run_checks() if m.id.startswith("fairqueue.")] == []


@pytest.mark.parametrize(
    ("fairqueue", "expected"),
    [
        ({"PREFIX": "a:b", "QUEUES": {"email": "email"}}, ["fairqueue.E005"]),
        ({"QUEUES": {"email": "email"}, "QUEUS": {}}, ["fairqueue.E018"]),
        ({"QUEUES": {}}, ["fairqueue.E006"]),
    ],
)
def test_a_bad_setting_is_one_error_not_one_per_task_queue_too(
    settings, clean_env, fairqueue, expected, db
):
    """With the settings wrong, the tasks backend's E010 says nothing (its message would
    repeat the settings error once per task queue, with a hint that does not apply)."""
    configure(settings, clean_env, fairqueue, {})
    assert [m.id for m in run_checks() if m.id.startswith("fairqueue.")] == expected


# -- ids are stable API: one per problem, unique, documented in order ----------------------


def documented_sections() -> dict[str, str]:
    """docs/checks.md's sections by id, whitespace collapsed."""
    parts = re.split(r"^## (fairqueue\.[EW]\d{3})\n", DOCS.read_text(), flags=re.MULTILINE)
    return {check_id: " ".join(body.split()) for check_id, body in zip(parts[1::2], parts[2::2])}


def all_ids() -> list[str]:
    ids = [check_id for check_id, _ in checks.SETTING_CHECKS.values()]
    return [
        *ids,
        checks.UNEXPECTED_ERROR_ID,
        "fairqueue.E010",
        "fairqueue.W011",
        checks.OUTBOX_UNKNOWN_JOB_TYPE_ID,
        "fairqueue.W025",
        checks.NO_SETTING_ID,
    ]


def test_ids__every_problem_has_one_and_no_two_problems_share_one():
    assert set(checks.SETTING_CHECKS) == set(Problem)
    assert len(set(all_ids())) == len(all_ids())


def test_docs__every_id_documented_once_in_order_of_its_number():
    documented = list(documented_sections())
    assert documented == sorted(documented, key=lambda check_id: check_id[-3:])
    assert sorted(documented) == sorted(all_ids())


def test_docs__each_section_gives_the_level_and_the_hint_the_check_gives():
    sections = documented_sections()
    for check_id, hint in checks.SETTING_CHECKS.values():
        assert "**Level:** Error" in sections[check_id]
        assert f"**Hint:** {hint}" in sections[check_id], check_id
    assert "**Level:** Warning" in sections["fairqueue.W011"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            ["free"],
            "FAIRQUEUE['TENANT_LIMITS']=['free'] is not allowed: expected a dict of plan tier "
            "(enterprise, pro, free) to a dict of limits",
        ),
        (
            {"gold": {"max_active": 2}},
            "FAIRQUEUE['TENANT_LIMITS'] has key 'gold', which is not allowed: expected a plan "
            "tier (enterprise, pro, free)",
        ),
        (
            {"free": {"max_running": 2}},
            "FAIRQUEUE['TENANT_LIMITS']['free'] has unknown key 'max_running': allowed keys "
            "are max_active, rate_max, rate_duration_ms, max_waiting",
        ),
        (
            {"free": {"rate_max": 10}},
            "FAIRQUEUE['TENANT_LIMITS']['free'] sets only one of rate_max and "
            "rate_duration_ms: a rate limit needs both (rate_max jobs started per "
            "rate_duration_ms)",
        ),
        (
            {"pro": {"max_waiting": True}},
            "FAIRQUEUE['TENANT_LIMITS']['pro']['max_waiting']=True is not allowed: expected a "
            "whole number in 1..100000000 or None for no limit",
        ),
    ],
)
def test_tenant_limits__e024_names_the_key_the_value_and_what_is_allowed(
    settings, clean_env, value, message
):
    configure(settings, clean_env, {"TENANT_LIMITS": value}, {})
    assert checks.check_settings() == [Error(message, hint=TENANT_LIMITS_HINT, id="fairqueue.E024")]


def test_tenant_limits__valid_tiers_parse_and_tiers_without_limits_are_dropped(settings, clean_env):
    configure(
        settings,
        clean_env,
        {
            "TENANT_LIMITS": {
                "free": {"max_active": 2, "rate_max": 10, "rate_duration_ms": 1000},
                "pro": {},
            }
        },
        {},
    )
    assert checks.check_settings() == []
    limits = conf.get_settings().tenant_limits
    assert set(limits) == {"free"}
    assert (limits["free"].max_active, limits["free"].rate_max) == (2, 10)
