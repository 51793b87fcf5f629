"""Every console page in Django admin's dark theme and on a 400 px screen, in a real
browser (Debian's Chromium, as tests/e2e/test_dashboard_browser.py drives it).

Dark both ways the admin offers it: the system's preference (prefers-color-scheme) and
the admin's theme toggle (``data-theme="dark"`` on <html>, kept in localStorage). On each
page every text in the main content reads against what is behind it (contrast 3:1 or
more, the colour computed), no background there is light in the dark theme, and the
admin's variables are what the console's own boxes use. At 400 px the page does not
scroll sideways (wide tables scroll inside their own box); at 1280 and 1400 px no table
sticks out of the content uncut by a scroll box of its own, and the plan list's Paused
column shows.

With ``FAIRQUEUE_SCREENSHOTS=1`` (``make screenshots``) it saves each page, light and
dark, under ``docs/screenshots/`` (committed: the docs show them), and the overview, a
culprit tenant, a job and the plan list at 400 px.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from django.urls import reverse
from playwright.sync_api import sync_playwright  # noqa: E402,I001 - after the skip there

from fairqueue.dashboard import stats as dashboard
from fairqueue.enqueue.api import enqueue_job, enqueue_jobs
from fairqueue.models import TenantPlan
from fairqueue.rebalance.passes import rebalance_queue
from fairqueue.tenants import pause_tenant
from tests.helpers import drain_with_stock_worker
from tests.helpers.console import age_jobs, fail_jobs
from tests.helpers.console_driver import (
    CHROMIUM,
    CHROMIUM_ARGS,
    OPERATOR_PERMS,
    login,
    make_staff,
    require_chromium,
)

require_chromium()
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
SAVE = os.environ.get("FAIRQUEUE_SCREENSHOTS", "").strip().lower() in ("1", "true", "yes")
NARROW = 400

# Run in the page: what does not follow the theme. Text is checked against the first
# opaque background behind it (WCAG's contrast ratio); in the dark theme a light
# background (luminance over 0.5) anywhere in the content is reported too.
_AUDIT = """(dark) => {
  const parse = (c) => {
    const m = (c.match(/[\\d.]+/g) || ['0', '0', '0', '0']).map(Number);
    const lin = (v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    };
    return {L: 0.2126 * lin(m[0]) + 0.7152 * lin(m[1]) + 0.0722 * lin(m[2]),
            a: m.length > 3 ? m[3] : 1};
  };
  const behind = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const p = parse(getComputedStyle(e).backgroundColor);
      if (p.a > 0.5) return p.L;
    }
    return parse(getComputedStyle(document.body).backgroundColor).L;
  };
  const bad = [];
  const where = (el) => el.tagName.toLowerCase()
    + ((el.getAttribute('class') || '').trim()
      ? '.' + el.getAttribute('class').trim().split(/\\s+/).join('.') : '');
  for (const el of document.querySelectorAll('#content *')) {
    const style = getComputedStyle(el);
    if (style.display === 'none' || style.visibility === 'hidden') continue;
    if (['title', 'desc', 'script', 'style', 'option'].includes(el.tagName.toLowerCase())) continue;
    const bg = parse(style.backgroundColor);
    if (dark && bg.a > 0.5 && bg.L > 0.5) bad.push('light background: ' + where(el));
    if (el instanceof SVGGeometryElement) {
      // chart marks: no light fill in the dark theme, lines that show against the page
      const fill = style.fill.startsWith('rgb') ? parse(style.fill) : null;
      if (dark && fill && fill.a > 0.5 && fill.L > 0.5) {
        bad.push(`light fill ${style.fill}: ${where(el)}`);
      }
      const stroke = style.stroke.startsWith('rgb') ? parse(style.stroke) : null;
      if (stroke && stroke.a > 0.5) {
        const b = behind(el);
        const ratio = (Math.max(stroke.L, b) + 0.05) / (Math.min(stroke.L, b) + 0.05);
        if (ratio < 1.5) bad.push(`stroke contrast ${ratio.toFixed(2)}: ${where(el)}`);
      }
    }
    const text = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!text || parseFloat(style.opacity) === 0) continue;
    const svgText = el instanceof SVGElement;
    const fg = parse(svgText ? style.fill : style.color).L;
    const b = behind(el);
    const ratio = (Math.max(fg, b) + 0.05) / (Math.min(fg, b) + 0.05);
    const said = el.textContent.trim().slice(0, 40);
    if (ratio < 3) bad.push(`contrast ${ratio.toFixed(2)}: ${where(el)} "${said}"`);
  }
  return bad;
}"""

# The console's own boxes take the admin's variables' values.
_VARIABLES = """() => {
  const root = getComputedStyle(document.documentElement);
  const probe = document.createElement('div');
  document.body.appendChild(probe);
  const value = (name) => { probe.style.color = root.getPropertyValue(name).trim();
    return getComputedStyle(probe).color; };
  const out = {bodyFg: value('--body-fg'), darkened: value('--darkened-bg'),
    bodyBg: value('--body-bg'), theme: document.documentElement.dataset.theme || '',
    body: getComputedStyle(document.body).backgroundColor,
    notes: [...document.querySelectorAll('#content .fq-note')]
      .map((e) => getComputedStyle(e).color),
    payload: [...document.querySelectorAll('.fq-payload')]
      .map((e) => getComputedStyle(e).backgroundColor)};
  probe.remove();
  return out;
}"""

_OVERFLOW = """() => ({page: document.documentElement.scrollWidth,
  content: Math.ceil(document.querySelector('#content').getBoundingClientRect().right)})"""

# Tables cut off at the content's edge: a wide table must scroll inside a box of its own
# (overflow-x auto/scroll) rather than stick out; and the plan list's Paused column shows.
_CLIPPED = """() => {
  const right = document.querySelector('#content').getBoundingClientRect().right;
  const bad = [];
  for (const table of document.querySelectorAll('#content table')) {
    let boxed = false;
    for (let e = table.parentElement; e && e.id !== 'content'; e = e.parentElement) {
      const o = getComputedStyle(e).overflowX;
      if (o === 'auto' || o === 'scroll') { boxed = true; break; }
    }
    if (!boxed && table.getBoundingClientRect().right > right + 1) {
      bad.push((table.className || 'table') + ' sticks out by '
        + Math.round(table.getBoundingClientRect().right - right) + ' px');
    }
  }
  const paused = document.querySelector('th.column-paused');
  if (paused && paused.getBoundingClientRect().right > window.innerWidth) {
    bad.push('the Paused column is off screen');
  }
  if (document.documentElement.scrollWidth > window.innerWidth) {
    bad.push('the page scrolls sideways');
  }
  return bad;
}"""


def test_console_css__colours_come_from_the_admin_variables():
    """Outside its own variables (mid-tone level and alert colours) the stylesheet names
    no colour but white or black text on those: every other colour is an admin variable,
    so the dark theme reaches every rule, also those the pages above did not show."""
    css = (
        Path(__file__).resolve().parents[2] / "fairqueue/static/fairqueue/dashboard.css"
    ).read_text()
    rules = re.sub(r":root\s*\{[^}]*\}", "", re.sub(r"/\*.*?\*/", "", css, flags=re.S), count=1)
    colour = r"#[0-9a-fA-F]{3,8}\b|rgba?\([^)]*\)|(?<![-\w])(?:white|black)(?![-\w])"
    named = re.findall(colour, rules)
    assert set(named) <= {"#fff", "#000"}, named
    assert "var(--body-fg)" in rules and "var(--darkened-bg)" in rules


def _seed(prefix: str, redis_client) -> dict[str, str]:
    TenantPlan.objects.create(tenant_id="exports-co", plan_tier="enterprise", max_active=2)
    from fairqueue.enqueue.priority import wire_tenant_plan_lookup

    wire_tenant_plan_lookup()
    # a failing tenant first (the failing worker takes the first jobs in line)
    enqueue_jobs("email", [{} for _ in range(6)], tenant_id="doomed", attempts=1)
    fail_jobs(prefix, "email", 6)
    rebalance_queue("email", rebalancer="themes-test")  # the history starts here
    for i in range(30):
        enqueue_job("email", {"i": i}, tenant_id=f"shop-{i % 3}", priority_level="low")
        enqueue_job("email", {"i": i}, tenant_id="exports-co")
        enqueue_job("email", {"i": i}, tenant_id=f"n{i % 2}", priority_level="critical")
    drain_with_stock_worker(prefix, "email", 40)
    rebalance_queue("email", rebalancer="themes-test")
    old = enqueue_jobs("report", [{} for _ in range(3)], tenant_id="late")
    age_jobs(redis_client, prefix, "report", [j.job_id for j in old], by_ms=600_000)
    job = enqueue_job("email", {"to": "someone"}, tenant_id="shop-1", priority_level="low")
    # the culprit: a flood of jobs past the bound; a paused tenant in the plan list
    flood = enqueue_jobs("email", [{} for _ in range(12)], tenant_id="flood")
    age_jobs(redis_client, prefix, "email", [j.job_id for j in flood], by_ms=600_000)
    TenantPlan.objects.create(tenant_id="sleepy", plan_tier="pro", rate_max=10)
    enqueue_jobs("email", [{} for _ in range(2)], tenant_id="sleepy")
    pause_tenant("sleepy", actor="on-call", source="incident")
    admin = "admin:fairqueue_dashboard"
    return {
        "overview": reverse(f"{admin}_changelist"),
        "queue": reverse(f"{admin}_queue", args=["email"]),
        "rebalance": reverse(f"{admin}_rebalance", args=["email"]),
        "tenant-search": reverse(f"{admin}_tenants") + "?q=shop",
        "tenant": reverse(f"{admin}_tenant", args=["exports-co"]),
        "culprit": reverse(f"{admin}_tenant", args=["flood"]),
        "plans": reverse("admin:fairqueue_tenantplan_changelist"),
        "tenant-limits": reverse(f"{admin}_tenant_limits", args=["exports-co"]),
        "tenant-pause": reverse(f"{admin}_tenant_action", args=["exports-co", "pause"]),
        "job-search": reverse(f"{admin}_jobs") + f"?id={job.job_id}",
        "job": reverse(f"{admin}_job", args=["email", job.job_id]),
        "job-remove": reverse(f"{admin}_job_remove", args=["email", job.job_id]),
    }


@pytest.mark.serial  # failed beside the parallel part on Django 6.1; passes alone
def test_browser__every_console_page_follows_the_dark_theme_and_fits_400px(
    live_server, fq_prefix, redis_client
):
    dashboard.clear_backlog_cache()
    make_staff("operator", *OPERATOR_PERMS, "run_rebalance", "view_job_payload")
    pages = _seed(fq_prefix, redis_client)
    if SAVE:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems: dict[str, list[str]] = {}

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            modes = {
                "light": browser.new_context(color_scheme="light"),
                "dark": browser.new_context(color_scheme="dark"),  # the system's preference
                "toggle": browser.new_context(color_scheme="light"),  # the admin's toggle
            }
            modes["toggle"].add_init_script("localStorage.setItem('theme', 'dark')")
            narrow = browser.new_context(
                color_scheme="dark", viewport={"width": NARROW, "height": 900}
            )
            for context in (*modes.values(), narrow):
                login(context.new_page(), live_server.url, "operator")
            for name, path in pages.items():
                url = f"{live_server.url}{path}{'&' if '?' in path else '?'}refresh_ms=600000"
                for mode, context in modes.items():
                    page = context.new_page()
                    page.set_viewport_size({"width": 1280, "height": 900})
                    assert page.goto(url).status == 200, (name, mode)
                    dark = mode != "light"
                    seen = page.evaluate(_VARIABLES)
                    if mode == "toggle":
                        assert seen["theme"] == "dark"
                    # the page is the admin's theme, and the console's boxes use its variables
                    assert seen["body"] == seen["bodyBg"], (name, mode, seen)
                    assert all(color == seen["bodyFg"] for color in seen["notes"]), (name, mode)
                    assert all(bg == seen["darkened"] for bg in seen["payload"]), (name, mode)
                    if dark:
                        assert seen["bodyBg"] == "rgb(18, 18, 18)", (name, mode, seen)
                    for problem in page.evaluate(_AUDIT, dark):
                        problems.setdefault(f"{name} ({mode})", []).append(problem)
                    if mode == "light":
                        for width in (1280, 1400):
                            page.set_viewport_size({"width": width, "height": 900})
                            for problem in page.evaluate(_CLIPPED):
                                problems.setdefault(f"{name} ({width} px)", []).append(problem)
                        page.set_viewport_size({"width": 1280, "height": 900})
                    if SAVE and mode != "toggle":
                        page.screenshot(
                            path=str(SCREENSHOTS / f"{name}-{mode}.png"), full_page=True
                        )
                    page.close()
                page = narrow.new_page()
                assert page.goto(url).status == 200, (name, "narrow")
                widths = page.evaluate(_OVERFLOW)
                assert widths["page"] <= NARROW and widths["content"] <= NARROW, (name, widths)
                if SAVE and name in ("overview", "tenant", "culprit", "job", "plans"):
                    page.screenshot(path=str(SCREENSHOTS / f"{name}-narrow.png"), full_page=True)
                page.close()
        finally:
            browser.close()
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())
