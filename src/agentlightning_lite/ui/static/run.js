// The training run page: metrics.jsonl rows from /api/metrics, drawn with uPlot, followed while they grow.
(function () {
  "use strict";
  var rows = [];
  var plots = {};
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"];

  function num(v) { return typeof v === "number" && isFinite(v) ? v : null; }
  function fmt(v) { return typeof v === "number" ? (Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : +v.toPrecision(4)) : String(v); }

  function chartData(keys) {
    var present = keys.filter(function (k) { return rows.some(function (r) { return num(r[k]) !== null; }); });
    var steps = [], byStep = {};
    rows.forEach(function (r) {
      if (typeof r.step !== "number") return;
      if (!(r.step in byStep)) { byStep[r.step] = {}; steps.push(r.step); }
      present.forEach(function (k) { if (num(r[k]) !== null) byStep[r.step][k] = r[k]; });
    });
    steps.sort(function (a, b) { return a - b; });
    var data = [steps];
    present.forEach(function (k) { data.push(steps.map(function (s) { return k in byStep[s] ? byStep[s][k] : null; })); });
    return { keys: present, data: data };
  }

  function draw() {
    var box = document.getElementById("charts");
    window.AGL_CHARTS.forEach(function (c, i) {
      var title = c[0], cd = chartData(c[1]);
      var id = "chart-" + i;
      var sig = cd.keys.join(",");
      var holder = document.getElementById(id);
      if (!holder) {
        holder = document.createElement("div");
        holder.id = id;
        holder.className = "chart";
        holder.setAttribute("data-title", title);
        box.appendChild(holder);
      }
      if (!cd.keys.length) {
        holder.innerHTML = "<h3>" + title + "</h3><p class='dim'>not logged (" + c[1].join(", ") + ")</p>";
        if (plots[id]) { plots[id].plot.destroy(); delete plots[id]; }
        return;
      }
      if (plots[id] && plots[id].sig === sig) { plots[id].plot.setData(cd.data); return; }
      if (plots[id]) plots[id].plot.destroy();
      holder.innerHTML = "";
      var opts = {
        title: title, width: Math.min(540, box.clientWidth || 540), height: 220,
        scales: { x: { time: false } },
        axes: [{ label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] }, {}],
        series: [{ label: "step" }].concat(cd.keys.map(function (k, j) {
          return { label: k, stroke: COLORS[j % COLORS.length], width: 2, spanGaps: true, points: { show: true, size: 4 } };
        })),
      };
      plots[id] = { sig: sig, plot: new uPlot(opts, cd.data, holder) };
    });
  }

  function tables() {
    var evals = rows.filter(function (r) { return "val/reward_mean" in r || "val/success_rate" in r; });
    var tb = document.querySelector("#evals tbody");
    tb.innerHTML = "";
    evals.forEach(function (r) {
      var tr = document.createElement("tr");
      [r.step, r["val/reward_mean"], r["val/success_rate"]].forEach(function (v) {
        var td = document.createElement("td"); td.className = "num"; td.textContent = v === undefined ? "-" : fmt(v); tr.appendChild(td);
      });
      tb.appendChild(tr);
    });
    if (!evals.length) tb.innerHTML = "<tr><td colspan='3' class='dim'>no evaluation yet</td></tr>";
    var last = rows.length ? rows[rows.length - 1] : {};
    var lt = document.querySelector("#last-row tbody");
    lt.innerHTML = "";
    Object.keys(last).sort().forEach(function (k) {
      var tr = document.createElement("tr"), th = document.createElement("th"), td = document.createElement("td");
      th.textContent = k; td.textContent = fmt(last[k]); td.className = "num"; tr.appendChild(th); tr.appendChild(td); lt.appendChild(tr);
    });
  }

  function poll() {
    fetch("/api/metrics?since=" + rows.length, { cache: "no-store", credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (m) {
        if (m.total < rows.length) rows = [];  // the file was replaced: start over
        var fresh = m.rows || [];
        if (fresh.length || !Object.keys(plots).length) {
          rows = rows.concat(fresh);
          draw();
          tables();
        }
        document.getElementById("row-count").textContent = rows.length;
        var live = m.age_s !== null && m.age_s < 120;
        var st = document.getElementById("run-status");
        st.setAttribute("data-live", live ? "1" : "0");
        st.lastChild.textContent = " rows" + (m.age_s === null ? " (no file yet)" :
          live ? " · following: last write " + Math.round(m.age_s) + " s ago" : " · not written for " + Math.round(m.age_s) + " s");
      })
      .catch(function () {})
      .then(function () { window.setTimeout(poll, 2000); });
  }
  poll();
})();
