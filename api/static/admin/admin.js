// Diarist admin overview: draws the two charts with the vendored uPlot and refreshes the page's live
// block and the charts from /admin/api/overview every few seconds (paused while the tab is hidden).
(function () {
  "use strict";
  var live = document.getElementById("live");
  var stamp = document.getElementById("updated");
  var seed = document.getElementById("series-data");
  if (!live || !seed || typeof uPlot === "undefined") return;

  var COLORS = { short: "#2f6fdf", long: "#c77d0a" };
  var EXTRA = ["#2fb380", "#b0245a", "#7a2bb0", "#0e6f7a"];
  var refreshMs = Math.min(5000, parseInt(stamp && stamp.dataset.refreshMs, 10) || 5000);

  function width(el) { return Math.max(300, el.clientWidth - 4); }

  function throughputData(s) { return [s.t, s.throughput]; }
  function depthData(s) {
    return [s.t].concat(Object.keys(s.depth).map(function (c) { return s.depth[c]; }));
  }

  function make(el, series, data, yLabel) {
    var opts = {
      width: width(el), height: 220,
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, Math.max(1, max * 1.15)]; } } },
      axes: [{ stroke: "#6b7785", grid: { stroke: "#eef1f4" } },
             { stroke: "#6b7785", grid: { stroke: "#eef1f4" }, label: yLabel, size: 56 }],
      legend: { live: true },
      series: [{}].concat(series)
    };
    return new uPlot(opts, data, el);
  }

  var s0 = JSON.parse(seed.textContent);
  var elT = document.getElementById("chart-throughput");
  var elD = document.getElementById("chart-depth");
  var depthClasses = Object.keys(s0.depth);
  var charts = [
    { el: elT, plot: make(elT, [{ label: "audio-s/s", stroke: "#2fb380", fill: "rgba(47,179,128,0.15)", width: 2 }],
                          throughputData(s0), "audio-s/s"), data: throughputData },
    { el: elD, plot: make(elD, depthClasses.map(function (c, i) {
        return { label: c, stroke: COLORS[c] || EXTRA[i % EXTRA.length], width: 2 };
      }), depthData(s0), "jobs"), data: depthData }
  ];

  window.addEventListener("resize", function () {
    charts.forEach(function (c) { c.plot.setSize({ width: width(c.el), height: 220 }); });
  });

  function apply(data) {
    live.innerHTML = data.html;
    var same = Object.keys(data.series.depth).join() === depthClasses.join();
    charts[0].plot.setData(throughputData(data.series));
    if (same) charts[1].plot.setData(depthData(data.series));
    if (stamp) stamp.textContent = "updated " + data.generated_at.slice(11, 19) + "Z";
  }

  function tick() {
    if (document.hidden) return;
    fetch("/admin/api/overview?html=1", { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (r.status === 401 || r.status === 403) { window.location = "/admin/login"; return null; }
        return r.ok ? r.json() : null;
      })
      .then(function (data) { if (data) apply(data); })
      .catch(function () { if (stamp) stamp.textContent = "connection lost, retrying"; });
  }

  setInterval(tick, refreshMs);
  document.addEventListener("visibilitychange", tick);
  window.diaristCharts = charts;  // for the browser test and for debugging
})();
