/*
 * fairqueue dashboard: refresh the numbers from the JSON endpoint every few seconds,
 * without reloading the page. Everything is written with textContent and DOM nodes
 * (never innerHTML), so job names and tenant ids can hold no markup. No dependencies.
 */
(function () {
  "use strict";

  var root = document.getElementById("fq-dashboard");
  if (!root) {
    return;
  }
  var statsUrl = root.getAttribute("data-stats-url");
  var refreshMs = parseInt(root.getAttribute("data-refresh-ms"), 10) || 5000;
  var jobUrl = root.getAttribute("data-job-url");
  var banner = root.querySelector("[data-fq-banner]");
  var stamp = root.querySelector("[data-fq-refreshed]");
  var refreshes = 0;

  function lookup(obj, path) {
    return path.split(".").reduce(function (value, key) {
      return value === null || value === undefined ? undefined : value[key];
    }, obj);
  }

  function show(value, fallback) {
    return value === null || value === undefined || value === "" ? fallback : String(value);
  }

  function node(tag, attrs, text) {
    var el = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      el.setAttribute(name, attrs[name]);
    });
    if (text !== undefined) {
      el.textContent = text;
    }
    return el;
  }

  function clear(el) {
    while (el.firstChild) {
      el.removeChild(el.firstChild);
    }
  }

  function detailUrl(jobType, jobId) {
    return jobUrl
      .replace("__type__", encodeURIComponent(jobType))
      .replace("__id__", encodeURIComponent(jobId));
  }

  // A tenant as a link to its page when the server gave its URL (tenant-less jobs: text).
  function tenantNode(tag, url, text, cls) {
    var el = node(tag, cls ? { class: cls } : {});
    if (url) {
      el.appendChild(node("a", { href: url }, text));
    } else {
      el.textContent = text;
    }
    return el;
  }

  function renderRows(tbody, stats) {
    clear(tbody);
    var jobs = stats.order.jobs;
    if (!jobs.length) {
      var empty = node("tr", { class: "fq-empty" });
      empty.appendChild(node("td", { colspan: "8" }, "No waiting jobs on this page."));
      tbody.appendChild(empty);
      return;
    }
    jobs.forEach(function (job) {
      var row = node("tr", { "data-job-id": job.job_id });
      if (job.drift) {
        row.className = "fq-row-drift";
      }
      row.appendChild(node("td", { class: "fq-pos" }, String(job.position)));
      var idCell = node("td", { class: "fq-job-id" });
      idCell.appendChild(
        node("a", { href: job.job_url || detailUrl(stats.job_type, job.job_id) }, job.job_id)
      );
      row.appendChild(idCell);
      row.appendChild(node("td", {}, job.name));
      var levelCell = node("td");
      levelCell.appendChild(node("span", { class: "fq-level fq-level-" + job.level }, job.level));
      row.appendChild(levelCell);
      row.appendChild(tenantNode("td", job.tenant_url, job.tenant_display));
      row.appendChild(node("td", {}, job.waited));
      row.appendChild(node("td", {}, job.decision_display));
      var flags = node("td");
      if (job.overdue) {
        flags.appendChild(node("span", { class: "fq-badge fq-overdue" }, "overdue"));
        flags.appendChild(document.createTextNode(" "));
      }
      if (job.drift) {
        flags.appendChild(
          node(
            "span",
            {
              class: "fq-badge fq-drift",
              title:
                "Added outside fairqueue's order (another producer, a promoted delayed job): " +
                "the next pass places it",
            },
            "unplaced"
          )
        );
      }
      row.appendChild(flags);
      tbody.appendChild(row);
    });
  }

  function renderList(el, items) {
    clear(el);
    items.forEach(function (text) {
      el.appendChild(node("li", {}, text));
    });
  }

  function renderTenants(el, tenants) {
    clear(el);
    if (!tenants.length) {
      el.textContent = "—";
      return;
    }
    tenants.forEach(function (t) {
      var span = tenantNode("span", t.tenant_url, t.display, "fq-tenant");
      span.appendChild(document.createTextNode(" (" + t.waiting + ")"));
      el.appendChild(span);
      el.appendChild(document.createTextNode(" "));
    });
  }

  var SVG_NS = "http://www.w3.org/2000/svg";

  function svgNode(tag, attrs) {
    var el = document.createElementNS(SVG_NS, tag);
    Object.keys(attrs).forEach(function (name) {
      el.setAttribute(name, attrs[name]);
    });
    return el;
  }

  // Redraw one history chart from the geometry the server computed (the page's
  // template draws the same geometry on the first load).
  function drawChart(svg, chart) {
    if (!chart) {
      return;
    }
    clear(svg);
    svg.setAttribute("viewBox", "0 0 " + chart.width + " " + chart.height);
    chart.rects.forEach(function (r) {
      var rect = svgNode("rect", { class: r.cls, x: r.x, y: r.y, width: r.w, height: r.h });
      if (r.title) {
        var title = svgNode("title", {});
        title.textContent = r.title;
        rect.appendChild(title);
      }
      svg.appendChild(rect);
    });
    chart.lines.forEach(function (l) {
      svg.appendChild(svgNode("line", { class: l.cls, x1: l.x1, x2: l.x2, y1: l.y1, y2: l.y2 }));
    });
    chart.texts.forEach(function (t) {
      var text = svgNode("text", { class: t.cls, x: t.x, y: t.y });
      text.textContent = t.text;
      svg.appendChild(text);
    });
  }

  function renderHistory(section, history) {
    if (!history) {
      return;
    }
    section.querySelectorAll("[data-fq-chart]").forEach(function (svg) {
      drawChart(svg, history.charts[svg.getAttribute("data-fq-chart")]);
    });
    var notes = section.querySelector("[data-fq-history-notes]");
    if (notes) {
      renderList(notes, history.notes);
    }
    var tenants = section.querySelector("[data-fq-history-tenants]");
    if (tenants) {
      clear(tenants);
      if (!history.tenants.length) {
        tenants.textContent = "—";
      }
      history.tenants.forEach(function (t) {
        var label = " (" + t.level + ", " + t.served + ", " + t.share_display + ")";
        var span = tenantNode("span", t.tenant_url, t.tenant, "fq-tenant");
        span.appendChild(document.createTextNode(label));
        tenants.appendChild(span);
        tenants.appendChild(document.createTextNode(" "));
      });
    }
  }

  // The noisy tenants as the JSON has them now: the page and its JSON never disagree
  // for longer than one refresh.
  var NOISY_COLUMNS = ["level", "running", "level_running", "share", "entitled", "factor"];

  function renderNoisy(box, noisy) {
    clear(box);
    var tenants = (noisy && noisy.tenants) || [];
    if (!tenants.length) {
      box.appendChild(node("p", { class: "fq-note", "data-fq-noisy-none": "" }, "None at this moment."));
      return;
    }
    var table = node("table", { class: "fq-noisy" });
    var head = node("tr");
    ["tenant", "level", "running", "of the level's running", "its share", "entitled now",
      "times its entitlement"].forEach(function (name) {
      head.appendChild(node("th", {}, name));
    });
    table.appendChild(node("thead")).appendChild(head);
    var body = node("tbody");
    tenants.forEach(function (n) {
      var row = node("tr", { "data-fq-noisy": n.display });
      row.appendChild(tenantNode("td", n.tenant_url, n.display));
      NOISY_COLUMNS.forEach(function (key) {
        row.appendChild(node("td", {}, show(n[key], "—")));
      });
      body.appendChild(row);
    });
    table.appendChild(body);
    box.appendChild(table);
  }

  function updateSection(section, stats) {
    section.querySelectorAll("[data-fq]").forEach(function (el) {
      el.textContent = show(lookup(stats, el.getAttribute("data-fq")), "—");
    });
    section.querySelectorAll("[data-fq-width]").forEach(function (el) {
      var pct = Number(lookup(stats, el.getAttribute("data-fq-width"))) || 0;
      el.setAttribute("width", pct + "%");
    });
    section.querySelectorAll("[data-fq-x]").forEach(function (el) {
      var pct = Number(lookup(stats, el.getAttribute("data-fq-x"))) || 0;
      el.setAttribute("x1", pct + "%");
      el.setAttribute("x2", pct + "%");
    });
    section.querySelectorAll("[data-fq-tenants]").forEach(function (el) {
      var level = stats.levels[el.getAttribute("data-fq-tenants")];
      renderTenants(el, level ? level.top_tenants : []);
    });
    var paused = section.querySelector("[data-fq-paused]");
    if (paused) {
      paused.hidden = !stats.paused;
    }
    var warnings = section.querySelector("[data-fq-warnings]");
    if (warnings) {
      renderList(warnings, stats.warnings);
    }
    var rows = section.querySelector("[data-fq-rows]");
    if (rows) {
      renderRows(rows, stats);
    }
    var noisy = section.querySelector("[data-fq-noisy-box]");
    if (noisy) {
      renderNoisy(noisy, stats.noisy);
    }
    renderHistory(section, stats.history);
  }

  function setBanner(text) {
    if (!banner) {
      return;
    }
    banner.textContent = text || "";
    banner.hidden = !text;
  }

  function sectionFor(jobType) {
    var sections = root.querySelectorAll("section[data-job-type]");
    for (var i = 0; i < sections.length; i += 1) {
      if (sections[i].getAttribute("data-job-type") === jobType) {
        return sections[i];
      }
    }
    return null;
  }

  function apply(body) {
    if (body.redis !== "ok") {
      setBanner(show(body.title, "Redis unreachable") + " (" + show(body.error, "unknown error") + ")");
      return;
    }
    if (!root.querySelector("section[data-job-type]") && body.queues.length) {
      // The page was rendered while Redis was down: it has no sections to update.
      window.location.reload();
      return;
    }
    setBanner("");
    body.queues.forEach(function (stats) {
      var section = sectionFor(stats.job_type);
      if (section) {
        updateSection(section, stats);
      }
    });
  }

  function refresh() {
    if (document.hidden) {
      window.setTimeout(refresh, refreshMs);
      return;
    }
    fetch(statsUrl, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { Accept: "application/json" },
    })
      .then(function (response) {
        var type = response.headers.get("content-type") || "";
        if (type.indexOf("application/json") === -1) {
          throw new Error("the server answered HTTP " + response.status + " (signed out?)");
        }
        return response.json();
      })
      .then(function (body) {
        apply(body);
        refreshes += 1;
        root.setAttribute("data-refresh-count", String(refreshes));
        if (stamp) {
          stamp.textContent = "Updated " + new Date().toLocaleTimeString() + ".";
        }
      })
      .catch(function (error) {
        setBanner("Dashboard refresh failed: " + error.message);
      })
      .then(function () {
        window.setTimeout(refresh, refreshMs);
      });
  }

  window.setTimeout(refresh, refreshMs);
})();
