// oncebox dashboard: live figures, live event list, and the operator's buttons.
// Everything shown is set with textContent or attributes, never parsed as HTML: payloads and
// names are attacker-controlled. Requests carry the session's CSRF token in a header that no
// other site can set.
"use strict";

(function () {
  const meta = document.querySelector('meta[name="oncebox-csrf"]');
  const csrf = meta ? meta.getAttribute("content") : "";
  const POLL_MS = 2000;

  function api(method, path, body) {
    const headers = { "x-oncebox-csrf": csrf };
    if (body !== undefined) headers["content-type"] = "application/json";
    return fetch(path, {
      method: method,
      headers: headers,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    }).then(function (r) {
      if (r.status === 401) {
        window.location.href = "/login";
        throw new Error("logged out");
      }
      return r.json().then(function (json) {
        if (!r.ok) throw new Error(json.detail || json.title || r.statusText);
        return json;
      });
    });
  }

  // A path segment that is "." or ".." (or "%2E%2E": the URL standard decodes it first) is
  // removed when the browser resolves a URL: "/events/shop/.." would open "/events/". No
  // path can carry such a key part; a query can.
  function dotSegment(s) {
    return s === "." || s === "..";
  }

  // The link to an event's page, as the server writes it (event_href in events.rs).
  function eventHref(source, id) {
    if (dotSegment(source) || dotSegment(id)) {
      return "/event?source=" + encodeURIComponent(source) + "&id=" + encodeURIComponent(id);
    }
    return "/events/" + encodeURIComponent(source) + "/" + encodeURIComponent(id);
  }

  function el(tag, text, attrs) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (attrs) Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    return e;
  }

  function badge(state) {
    const cls = { completed: "ok", delivered: "ok", rejected: "bad", dead: "bad", conflict: "bad",
                  uncertain: "warn", retrying: "warn" }[state] || "neutral";
    return el("span", state, { class: "badge " + cls });
  }

  function flash(message) {
    let box = document.getElementById("flash");
    if (!box) {
      box = el("p", null, { id: "flash", class: "error", role: "alert" });
      document.querySelector("main").prepend(box);
    }
    box.textContent = message;
  }

  // The operator's buttons: retry, mark delivered, mark dead.
  document.addEventListener("click", function (ev) {
    const b = ev.target.closest("button[data-action]");
    if (!b) return;
    const id = encodeURIComponent(b.getAttribute("data-id"));
    const action = b.getAttribute("data-action");
    const call = action === "retry"
      ? api("POST", "/v1/deliveries/" + id + "/retry")
      : api("POST", "/v1/deliveries/" + id + "/resolve",
            { outcome: action, note: "settled from the dashboard" });
    b.disabled = true;
    call.then(function () { window.location.reload(); })
        .catch(function (e) { b.disabled = false; flash(e.message); });
  });

  // Overview: counters per source and outcome, and the last hour's arrivals.
  const counters = document.querySelector("#counters tbody");
  const OUTCOMES = ["completed", "rejected", "stale", "processing", "uncertain", "conflict"];
  function drawCounters(data) {
    const per = {};
    data.counts.forEach(function (c) {
      (per[c.source] = per[c.source] || {})[c.state] = c.count;
    });
    const rows = Object.keys(per).sort().map(function (source) {
      const tr = el("tr");
      const td = el("td");
      td.appendChild(el("a", source, { href: "/events?source=" + encodeURIComponent(source) }));
      tr.appendChild(td);
      OUTCOMES.forEach(function (o) { tr.appendChild(el("td", per[source][o] || 0, { class: "num" })); });
      return tr;
    });
    if (rows.length === 0) {
      const tr = el("tr", null, { class: "empty" });
      tr.appendChild(el("td", "No events yet.", { colspan: "7" }));
      rows.push(tr);
    }
    counters.replaceChildren.apply(counters, rows);
  }

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function drawChart(data) {
    const chart = document.getElementById("chart");
    const n = Math.round(data.window_seconds / data.bucket_seconds);
    const bucketMs = data.bucket_seconds * 1000;
    const last = Math.floor(data.now_ms / bucketMs) * bucketMs;
    const totals = new Array(n).fill(0);
    data.buckets.forEach(function (b) {
      const i = n - 1 - Math.round((last - b.start_ms) / bucketMs);
      if (i >= 0 && i < n) totals[i] += b.count;
    });
    const max = Math.max(1, Math.max.apply(null, totals));
    const W = 720, H = 140, bw = W / n;
    const parts = [svg("line", { x1: 0, y1: H, x2: W, y2: H, class: "axis" })];
    totals.forEach(function (v, i) {
      const h = (v / max) * (H - 10);
      const r = svg("rect", { x: (i * bw + 1).toFixed(1), y: (H - h).toFixed(1),
                              width: (bw - 2).toFixed(1), height: h.toFixed(1), class: "bar" });
      r.appendChild(svg("title", {}, v + " event(s), " + (n - 1 - i) + " min ago"));
      parts.push(r);
    });
    parts.push(svg("text", { x: 0, y: 156, class: "label" }, "60 min ago"));
    parts.push(svg("text", { x: W, y: 156, class: "label end" }, "now"));
    parts.push(svg("text", { x: 0, y: 10, class: "label" }, "max " + max + "/min"));
    chart.replaceChildren.apply(chart, parts);
    const total = totals.reduce(function (a, b) { return a + b; }, 0);
    document.getElementById("chart-total").textContent = total + " event(s) in the last hour";
  }
  if (counters) {
    let refreshing = false;
    const refresh = function () {
      // One at a time, as the event list polls: a slow store must not pile them up.
      if (refreshing) return;
      refreshing = true;
      api("GET", "/v1/activity").then(function (d) { drawCounters(d); drawChart(d); })
        .catch(function (e) { flash(e.message); })
        .then(function () { refreshing = false; });
    };
    refresh();
    setInterval(refresh, POLL_MS);
  }

  // Event list: new arrivals appear at the end of the last page. On PostgreSQL an event's
  // number is taken before its transaction commits, so it may become visible after later
  // numbers were listed: each poll looks back LOOK_BACK numbers (never before the page's
  // start, data-from), follows the pages from there, and skips the events already shown and
  // those older than the page's time range (data-oldest), which the page left out.
  const list = document.querySelector("#events[data-live]");
  if (list) {
    const LOOK_BACK = 1000, MAX_PAGES = 20;
    const source = list.getAttribute("data-source");
    const outcome = list.getAttribute("data-outcome");
    const from = Number(list.getAttribute("data-from") || 0);
    const oldest = list.hasAttribute("data-oldest") ? Number(list.getAttribute("data-oldest")) : null;
    const shown = new Set();
    list.querySelectorAll("tr > td.num:first-child").forEach(function (td) {
      shown.add(Number(td.textContent));
    });
    const show = function (e) {
      if (Number(e.seq) > Number(list.getAttribute("data-live"))) list.setAttribute("data-live", e.seq);
      if (Number(e.seq) <= from || shown.has(Number(e.seq))) return;
      shown.add(Number(e.seq));
      if (oldest !== null && Date.parse(e.received_at) < oldest) return;
      if (outcome && (outcome === "conflict" ? e.conflicts === 0 : e.state !== outcome)) return;
      const tr = el("tr", null, { class: "arrived" });
      tr.appendChild(el("td", e.seq, { class: "num" }));
      const t = el("td");
      t.appendChild(el("time", e.received_at, { datetime: e.received_at }));
      tr.appendChild(t);
      tr.appendChild(el("td", e.source));
      const id = el("td");
      id.appendChild(el("a", e.event_id, { class: "event-link",
        href: eventHref(e.source, e.event_id) }));
      tr.appendChild(id);
      const st = el("td");
      st.appendChild(badge(e.state));
      tr.appendChild(st);
      tr.appendChild(el("td", e.conflicts, { class: "num" }));
      list.appendChild(tr);
      const none = document.getElementById("no-events");
      if (none) none.remove();
    };
    const fetchFrom = function (after, pages) {
      let q = "/v1/events?limit=500&after=" + encodeURIComponent(after);
      if (source) q += "&source=" + encodeURIComponent(source);
      return api("GET", q).then(function (page) {
        page.items.forEach(show);
        if (page.next && pages > 1) return fetchFrom(page.next, pages - 1);
      });
    };
    let polling = false;
    const poll = function () {
      // One poll at a time: a slow store must not pile them up.
      if (polling) return;
      polling = true;
      const back = Math.max(from, Number(list.getAttribute("data-live")) - LOOK_BACK);
      fetchFrom(back, MAX_PAGES).catch(function (e) { flash(e.message); })
        .then(function () { polling = false; });
    };
    setInterval(poll, POLL_MS);
  }

  // Event page: while a delivery is still on its way, follow it and reload when it settles.
  const moving = document.querySelectorAll(
    'section.delivery[data-state="pending"], section.delivery[data-state="in_flight"], section.delivery[data-state="retrying"]');
  const source = document.getElementById("source");
  const eventId = document.getElementById("event-id");
  if (moving.length > 0 && source && eventId &&
      (dotSegment(source.textContent) || dotSegment(eventId.textContent))) {
    // The API names an event by its path, which cannot hold this key: the page is read again.
    setInterval(function () { window.location.reload(); }, POLL_MS);
  } else if (moving.length > 0 && source && eventId) {
    const path = "/v1/sources/" + encodeURIComponent(source.textContent) + "/events/" +
      encodeURIComponent(eventId.textContent);
    let following = false;
    const follow = function () {
      // One at a time, as the other pollers: a slow store must not pile them up (a retrying
      // delivery may be followed for days, each answer the whole event).
      if (following) return;
      following = true;
      api("GET", path).then(function (e) {
        const changed = (e.deliveries || []).some(function (d) {
          const s = document.getElementById("delivery-" + d.id);
          return s && s.getAttribute("data-state") !== d.state;
        });
        if (changed) window.location.reload();
      }).catch(function (e) { flash(e.message); })
        .then(function () { following = false; });
    };
    setInterval(follow, POLL_MS);
  }
})();
