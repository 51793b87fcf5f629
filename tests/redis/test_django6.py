"""Django 6: the tasks backend as a ``django.tasks`` backend, and what holds on both Django
5.2 (the backport) and 6.1 (``django.tasks`` itself; ``make test-django6`` runs the whole
suite there without the backport): the framework's base class, its exceptions, its three
signals from enqueue and from ``fairqueue_worker``, and a fresh Django 6.1 project that
uses ``django.tasks`` alone."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import django
import pytest
from packaging.requirements import Requirement

from fairqueue.tasks import frameworks
from fairqueue.tasks.backend import FairQueueBackend, UnknownTaskQueueError
from fairqueue.tasks.frameworks import FRAMEWORKS, PRIMARY
from fairqueue.tasks.jobs import InvalidTaskError, TaskResultDoesNotExist
from tests.helpers.fresh_project import shop_project
from tests.helpers.keys import REDIS_URL
from tests.helpers.tasks import (
    BoomError,
    add,
    explode,
    record,
    run_worker,
)

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
DJANGO_6 = django.VERSION >= (6, 0)
HAS_BACKPORT = importlib.util.find_spec("django_tasks") is not None
#: The backport, installed apart (`make test-django6` puts it there): the both-frameworks
#: test puts it on a subprocess's path, so the suite itself runs without it.
BACKPORT_DIR = ROOT / ".venv-dj6" / "backport"
SIGNALS = ("task_enqueued", "task_started", "task_finished")


@pytest.fixture
def broker(fq_prefix):
    from fairqueue.broker import Broker

    return Broker(REDIS_URL, fq_prefix)


@pytest.fixture
def received():
    """Every installed framework's three signals, as (framework, signal, sender, status,
    result) in the order they came."""
    seen: list[tuple] = []
    connected = []
    for framework in FRAMEWORKS:
        for name in SIGNALS:

            def receiver(sender, task_result, _f=framework.name, _n=name, **kwargs):
                seen.append((_f, _n, sender, str(task_result.status), task_result))

            framework.signals[name].connect(receiver, weak=False)
            connected.append((framework.signals[name], receiver))
    yield seen
    for signal, receiver in connected:
        signal.disconnect(receiver)


def test_frameworks__django_tasks_itself_on_django_6_the_backport_on_5_2():
    names = [framework.name for framework in FRAMEWORKS]
    if DJANGO_6:
        from django.tasks.backends.base import BaseTaskBackend

        assert names[0] == "django.tasks" and PRIMARY.BaseTaskBackend is BaseTaskBackend
        assert issubclass(FairQueueBackend, BaseTaskBackend)
    else:
        assert names == ["django_tasks"]
    assert ("django_tasks" in names) == HAS_BACKPORT
    assert issubclass(FairQueueBackend, PRIMARY.BaseTaskBackend)


def test_exceptions__every_installed_frameworks_except_catches_them(fq_prefix):
    for framework in FRAMEWORKS:
        assert issubclass(InvalidTaskError, framework.invalid_task)
        assert issubclass(UnknownTaskQueueError, framework.invalid_task)
        assert issubclass(TaskResultDoesNotExist, framework.result_does_not_exist)
        with pytest.raises(framework.invalid_task, match="nowhere"):
            add.using(queue_name="nowhere").enqueue(1, 2)
        with pytest.raises(framework.invalid_task, match="JSON-serialisable"):
            add.enqueue(object(), 2)
        with pytest.raises(framework.result_does_not_exist):
            add.get_result("f" * 32)
    # Django's own checks, through the backend, raise the same both-frameworks class.
    with pytest.raises(InvalidTaskError, match="priority"):
        add.using(priority=1000)


def test_signals__enqueue_and_the_worker_send_each_frameworks_three(broker, received, caplog):
    with caplog.at_level(logging.DEBUG):
        ok = add.enqueue(2, 3)
        failing = explode.enqueue("kaboom")
        assert [(f, n, s) for f, n, s, _, _ in received] == [
            (framework.name, "task_enqueued", FairQueueBackend)
            for _ in range(2)
            for framework in FRAMEWORKS
        ]
        assert {r.id for *_, r in received} == {ok.id, failing.id}
        assert all(status == "READY" for _, _, _, status, _ in received)
        received.clear()
        run_worker(broker, "email")

    by_job: dict[str, list] = {}
    for framework, name, sender, status, result in received:
        assert sender is FairQueueBackend
        by_job.setdefault(result.id, []).append((framework, name, status))
    expected_ok = [(f.name, "task_started", "RUNNING") for f in FRAMEWORKS] + [
        (f.name, "task_finished", "SUCCESSFUL") for f in FRAMEWORKS
    ]
    expected_failed = [(f.name, "task_started", "RUNNING") for f in FRAMEWORKS] + [
        (f.name, "task_finished", "FAILED") for f in FRAMEWORKS
    ]
    assert by_job == {ok.id: expected_ok, failing.id: expected_failed}
    finished = {r.id: r for _, name, _, _, r in received if name == "task_finished"}
    assert finished[ok.id].return_value == {"sum": 5, "parts": [2, 3]}
    assert finished[ok.id].attempts == 1 and finished[ok.id].finished_at is not None
    (error,) = finished[failing.id].errors
    assert error.exception_class is BoomError and "kaboom" in error.traceback
    # What get_result reads back afterwards agrees with what the receivers were sent.
    assert add.get_result(ok.id).return_value == {"sum": 5, "parts": [2, 3]}
    assert explode.get_result(failing.id).errors[0].exception_class is BoomError
    # Django's own task logging (its receivers of the same signals) saw fairqueue's jobs.
    logged = {
        (r.name, r.getMessage().split()[1]) for r in caplog.records if "Task id=" in r.message
    }
    for framework in FRAMEWORKS:
        logger = framework.name  # "django.tasks" / "django_tasks"
        assert (logger, f"id={ok.id}") in logged, sorted(logged)
        assert (logger, f"id={failing.id}") in logged, sorted(logged)


def test_signals__a_receiver_that_raises_neither_undoes_the_enqueue_nor_fails_the_job(
    broker, caplog
):
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("a receiver's bug")

    for framework in FRAMEWORKS:
        for name in SIGNALS:
            framework.signals[name].connect(broken, weak=False)
    try:
        with caplog.at_level(logging.WARNING, logger="fairqueue.tasks"):
            result = record.enqueue("still enqueued")
            run_worker(broker, "email")
    finally:
        for framework in FRAMEWORKS:
            for name in SIGNALS:
                framework.signals[name].disconnect(broken)
    done = record.get_result(result.id)
    assert str(done.status) == "SUCCESSFUL" and done.return_value == "still enqueued"
    warnings = [r.getMessage() for r in caplog.records if r.name == "fairqueue.tasks"]
    assert len(warnings) == 3 * len(FRAMEWORKS)
    assert all("raised RuntimeError" in w and "a receiver's bug" not in w for w in warnings)


@pytest.mark.skipif(django.VERSION < (6, 1), reason="Django 6.1 forwards @task(**kwargs)")
def test_task_decorator__extra_arguments_are_refused_tenant_is_a_call_argument():
    from django.tasks import task

    def send(invoice_id, tenant_id=None): ...

    with pytest.raises(TypeError, match="tenant"):
        task(tenant="acme")(send)
    with pytest.raises(TypeError, match="cost"):
        task(cost=5)(send)


def test_package__its_django_requirement_keeps_the_running_django(installed_wheel):
    """pip keeps a project's Django when installing fairqueue exactly when the wheel's
    requirement admits it: Django 5.2 here, 6.1 under `make test-django6`."""
    (metadata,) = installed_wheel.glob("django_fairqueue-*.dist-info/METADATA")
    requirements = [
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.read_text().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    (dj,) = [r for r in requirements if r.name.lower() == "django"]
    assert dj.specifier.contains(django.get_version()), (str(dj), django.get_version())
    for version in ("5.2.19", "6.0.10", "6.1.3"):
        assert dj.specifier.contains(version), (str(dj), version)
    classifiers = metadata.read_text()
    for supported in ("Django :: 5.2", "Django :: 6.0", "Django :: 6.1", "Python :: 3.13"):
        assert supported in classifiers
    # The operator's files ship with it.
    contrib = installed_wheel / "fairqueue" / "contrib"
    for shipped in ("prometheus/rules.yml", "prometheus/rules_test.yml", "grafana/fairqueue.json"):
        assert (contrib / shipped).is_file(), shipped


@pytest.mark.slow
@pytest.mark.skipif(
    django.VERSION < (6, 1) or HAS_BACKPORT,
    reason="Django 6.1 with django.tasks alone (make test-django6)",
)
def test_fresh_project__django_6_1_tasks_alone_enqueue_worker_result_and_signals(
    tmp_path,
    fq_prefix,
    installed_wheel,
):
    """A Django 6.1 project with no backport: a TASKS setting, ``django.tasks.task``
    functions, ``enqueue`` from manage.py, ``fairqueue_worker --burst``, ``get_result``,
    and a receiver of each of ``django.tasks.signals``' three signals, in real processes
    with fairqueue installed from its wheel."""
    log = tmp_path / "log.jsonl"
    manage = shop_project(
        tmp_path,
        tasks_py="""
            import json, os
            from django.dispatch import receiver
            from django.tasks import task
            from django.tasks.signals import task_enqueued, task_finished, task_started

            def _log(kind, **fields):
                with open(os.environ["LOG_FILE"], "a") as out:
                    out.write(json.dumps({"kind": kind, **fields}) + "\\n")

            @receiver(task_enqueued)
            def on_enqueued(sender, task_result, **kwargs):
                _log("enqueued", id=task_result.id, status=str(task_result.status),
                     sender=sender.__name__)

            @receiver(task_started)
            def on_started(sender, task_result, **kwargs):
                _log("started", id=task_result.id, status=str(task_result.status))

            @receiver(task_finished)
            def on_finished(sender, task_result, **kwargs):
                _log("finished", id=task_result.id, status=str(task_result.status))

            @task(priority=75)
            def urgent(label, tenant_id=None):
                _log("ran", label=label)
                return {"label": label}

            @task(priority=-75)
            def batch(label, tenant_id=None):
                _log("ran", label=label)
                return {"label": label}
            """,
        apps=("fairqueue",),
        redis_url=REDIS_URL,
        prefix=fq_prefix,
        site=installed_wheel,
        LOG_FILE=str(log),
    )
    manage("migrate", "--noinput", "-v", "0")
    manage(
        "shell",
        "-v",
        "0",
        "-c",
        "import django, importlib.util\n"
        "assert django.VERSION >= (6, 1) and importlib.util.find_spec('django_tasks') is None\n"
        "from shop.tasks import urgent, batch\n"
        "ids = [urgent.enqueue(f'u{i}', tenant_id='acme').id for i in range(8)]\n"
        "ids += [batch.enqueue(f'b{i}', tenant_id='tiny').id for i in range(2)]\n"
        "open('ids.json', 'w').write(__import__('json').dumps(ids))\n",
    )
    manage("fairqueue_worker", "--burst", "-v", "0")
    results = manage(
        "shell",
        "-v",
        "0",
        "-c",
        "import json\n"
        "from shop.tasks import urgent, batch\n"
        "ids = json.load(open('ids.json'))\n"
        "for i, task in zip(ids, [urgent] * 8 + [batch] * 2):\n"
        "    r = task.get_result(i)\n"
        "    print(json.dumps([r.id, str(r.status), r.return_value, r.attempts]))\n",
    )
    ids = json.loads((tmp_path / "ids.json").read_text())
    events = [json.loads(line) for line in log.read_text().splitlines()]
    u, b = [f"u{i}" for i in range(8)], [f"b{i}" for i in range(2)]
    # The fair order: critical 4:1 against low from the head of the queue.
    assert [e["label"] for e in events if e["kind"] == "ran"] == u[:4] + b[:1] + u[4:] + b[1:]
    # Each signal, once per job, with the status Django documents for it.
    for kind, status in (("enqueued", "READY"), ("started", "RUNNING"), ("finished", "SUCCESSFUL")):
        assert sorted(e["id"] for e in events if e["kind"] == kind) == sorted(ids), kind
        assert {e["status"] for e in events if e["kind"] == kind} == {status}, kind
    assert {e["sender"] for e in events if e["kind"] == "enqueued"} == {"FairQueueBackend"}
    rows = [json.loads(line) for line in results.splitlines()]
    assert [row[0] for row in rows] == ids
    assert all(row[1] == "SUCCESSFUL" and row[3] == 1 for row in rows)
    assert [row[2]["label"] for row in rows] == u + b


def test_frameworks_module__refuses_to_import_without_a_framework(tmp_path):
    """Without either framework the backend says what to install (a project that never
    uses it does not import it: ``import fairqueue.tasks`` needs neither)."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        textwrap.dedent(
            """
            import sys
            class _Block:
                def find_spec(self, name, path=None, target=None):
                    if name in ("django.tasks", "django_tasks"):
                        raise ImportError(f"no {name} here")
            sys.meta_path.insert(0, _Block())
            """
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import fairqueue.tasks\n"
            "try:\n"
            "    import fairqueue.tasks.frameworks\n"
            "except ImportError as exc:\n"
            "    print(exc)\n",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "needs a Django task framework" in done.stdout
    assert frameworks.PRIMARY is FRAMEWORKS[0]


BOTH_FRAMEWORKS = """
import json
import django

django.setup()
import django.tasks.exceptions as dj_exc
import django.tasks.signals as dj_signals
import django_tasks.exceptions as bp_exc
import django_tasks.signals as bp_signals

from fairqueue.tasks.frameworks import FRAMEWORKS
from fairqueue.worker.runner import Worker
from tests.helpers.dual_tasks import backport_add, django_add

out = {"frameworks": [f.name for f in FRAMEWORKS], "seen": [], "caught": []}
for module in (dj_signals, bp_signals):
    for name in ("task_enqueued", "task_started", "task_finished"):
        def receiver(sender, task_result, _m=module.__name__, _n=name, **kwargs):
            out["seen"].append([_m, _n, type(task_result).__module__, task_result.id])
        getattr(module, name).connect(receiver, weak=False)
r1 = backport_add.enqueue(1, 2)
r2 = django_add.enqueue(3, 4)
out["ids"] = [r1.id, r2.id]
out["enqueued_types"] = [type(r1).__module__, type(r2).__module__]
for task in (backport_add, django_add):
    for kind in (dj_exc.InvalidTask, bp_exc.InvalidTaskError):
        try:
            task.enqueue(object(), 1)
        except kind:
            out["caught"].append(kind.__module__)
    for kind in (dj_exc.TaskResultDoesNotExist, bp_exc.TaskResultDoesNotExist):
        try:
            task.get_result("f" * 32)
        except kind:
            out["caught"].append(kind.__module__)
Worker(["email"], burst=True, install_signal_handlers=False).run()
done = [backport_add.get_result(r1.id), django_add.get_result(r2.id)]
out["done"] = [[type(r).__module__, str(r.status), r.return_value] for r in done]
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not DJANGO_6 or HAS_BACKPORT or not (BACKPORT_DIR / "django_tasks").is_dir(),
    reason="Django 6 with the backport installed apart in .venv-dj6/backport (make test-django6)",
)
def test_both_frameworks__either_task_either_except_and_both_signals(fq_prefix):
    """A Django 6 project that still has the backport: a backport ``Task`` and a Django
    ``Task`` through the same backend, each result in its own framework, each
    framework's ``except`` catching the errors, both frameworks' signals for both."""
    done = subprocess.run(
        [sys.executable, "-c", BOTH_FRAMEWORKS],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(BACKPORT_DIR), str(ROOT)]),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "FAIRQUEUE_PREFIX": fq_prefix,
            "FAIRQUEUE_REDIS_URL": REDIS_URL,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["frameworks"] == ["django.tasks", "django_tasks"]
    assert out["enqueued_types"] == ["django_tasks.base", "django.tasks.base"]
    assert out["done"] == [
        ["django_tasks.base", "SUCCESSFUL", 3],
        ["django.tasks.base", "SUCCESSFUL", 7],
    ]
    assert out["caught"] == ["django.tasks.exceptions", "django_tasks.exceptions"] * 4
    backport_id, django_id = out["ids"]
    for job_id, kind in ((backport_id, "django_tasks.base"), (django_id, "django.tasks.base")):
        got = sorted((m, n) for m, n, t, i in out["seen"] if i == job_id and t == kind)
        assert got == sorted(
            (module, name)
            for module in ("django.tasks.signals", "django_tasks.signals")
            for name in SIGNALS
        ), out["seen"]
