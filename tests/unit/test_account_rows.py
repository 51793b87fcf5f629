"""Starts by account, pure: a queue's most served tenants summed per account (a tenant of
none its own, no tenant and internal work left out), and the overview's sum over queues."""

from fairqueue.dashboard.account_rows import served_by_account, top_accounts


def test_served_by_account__sums_an_accounts_tenants_over_levels_and_keeps_lone_tenants():
    served = [
        {"level": "normal", "tenant": "a-1", "served": 30},
        {"level": "low", "tenant": "a-1", "served": 5},
        {"level": "normal", "tenant": "a-2", "served": 20},
        {"level": "normal", "tenant": "solo", "served": 40},
        {"level": "normal", "tenant": None, "served": 7},
        {"level": "normal", "tenant": "default", "served": 3},
        {"level": "critical", "tenant": "(internal)", "served": 9},
    ]
    rows = served_by_account(served, 114, {"a-1": "acct", "a-2": "acct"})
    assert [(r["account"], r["tenant"], r["served"], r["tenants"]) for r in rows] == [
        ("acct", None, 55, 2),
        (None, "solo", 40, 1),
    ]
    assert rows[0]["share"] == 55 / 114
    assert served_by_account([], 0, {}) == []


def test_top_accounts__sums_over_queues_of_all_their_starts():
    def queue(total, *rows):
        return total, list(rows)

    acct = {"account": "acct", "tenant": None, "url": "/a/", "tenants": 2}
    solo = {"account": None, "tenant": "solo", "url": "/t/", "tenants": 1}
    first = queue(100, {**acct, "served": 30}, {**solo, "served": 50})
    found = top_accounts([first, queue(100, {**acct, "served": 40})], listed=5)
    assert [(a.account, a.tenant, a.served, a.share) for a in found] == [
        ("acct", None, 70, "35%"),
        (None, "solo", 50, "25%"),
    ]
    (only,) = top_accounts([first], listed=1)
    assert only.tenant == "solo"
    assert top_accounts([queue(0)]) == ()
