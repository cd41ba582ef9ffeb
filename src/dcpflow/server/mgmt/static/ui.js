// dcpflow status page: refresh <main> from /ui/main and draw the charts from /ui/series.json.
// Plain script, no build step. Open <details> stay open across refreshes.
(function () {
  "use strict";
  var main = document.querySelector("main");
  var every = (parseInt(main.getAttribute("data-refresh"), 10) || 2) * 1000;

  function openNames() {
    var names = {};
    main.querySelectorAll("details[open]").forEach(function (d) { names[d.getAttribute("data-name")] = true; });
    return names;
  }

  function refreshMain() {
    return fetch("/ui/main", { credentials: "same-origin" }).then(function (r) {
      if (r.status === 401) { window.location = "/ui/login"; return null; }
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (html === null) { return; }
      var open = openNames();
      main.innerHTML = html;
      main.querySelectorAll("details").forEach(function (d) {
        if (open[d.getAttribute("data-name")]) { d.open = true; }
      });
    });
  }

  function draw(id, values) {
    var svg = document.getElementById(id);
    var now = document.getElementById(id + "-now");
    if (!svg) { return; }
    var line = svg.querySelector("polyline");
    var n = values.length;
    var top = Math.max.apply(null, values.concat([1]));
    var points = values.map(function (v, i) {
      var x = n > 1 ? (i * 300) / (n - 1) : 0;
      var y = 78 - (v / top) * 74;
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    line.setAttribute("points", points.join(" "));
    svg.setAttribute("data-points", String(n));
    if (now) { now.textContent = n ? "now " + values[n - 1] + ", peak " + top : ""; }
  }

  function refreshCharts() {
    return fetch("/ui/series.json", { credentials: "same-origin" }).then(function (r) {
      return r.ok ? r.json() : null;
    }).then(function (series) {
      if (series === null) { return; }
      draw("chart-ops", series.ops);
      draw("chart-backlog", series.backlog);
    });
  }

  function tick() {
    Promise.all([refreshMain(), refreshCharts()]).catch(function () {}).then(function () {
      setTimeout(tick, every);
    });
  }
  refreshCharts();
  setTimeout(tick, every);
})();
