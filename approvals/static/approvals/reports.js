// The team dashboard's charts (approvals/reports.html): drawn with Chart.js (shipped beside
// this file) from the JSON the page carries (#report-charts), each a picture of the table that
// follows it. Colours come from the stylesheet's custom properties, read again when the
// system switches between light and dark, so a chart stays readable in both.
(function () {
  "use strict";

  var drawn = [];

  function cssVar(name, fallback) {
    var value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return value || fallback;
  }

  function palette() {
    return {
      fg: cssVar("--fg", "#1c2330"),
      muted: cssVar("--muted", "#5b6677"),
      line: cssVar("--line", "#d9dee6"),
      series: [cssVar("--accent", "#2452c7"), cssVar("--bad", "#b3261e"), cssVar("--ok", "#1d7a46")],
    };
  }

  function config(spec, colours) {
    var horizontal = !!spec.horizontal;
    var valueAxis = {
      beginAtZero: true,
      title: { display: true, text: spec.unit, color: colours.muted },
      ticks: { color: colours.fg, precision: spec.unit === "minutes" || spec.unit === "%" ? undefined : 0 },
      grid: { color: colours.line },
    };
    var labelAxis = { ticks: { color: colours.fg, autoSkip: true }, grid: { display: false } };
    return {
      type: spec.type,
      data: {
        labels: spec.labels,
        datasets: spec.datasets.map(function (set, i) {
          var colour = colours.series[i % colours.series.length];
          return { label: set.label, data: set.data, backgroundColor: colour, borderColor: colour };
        }),
      },
      options: {
        indexAxis: horizontal ? "y" : "x",
        responsive: true,
        maintainAspectRatio: false,
        animation: false,
        scales: horizontal ? { x: valueAxis, y: labelAxis } : { x: labelAxis, y: valueAxis },
        plugins: {
          legend: { display: spec.datasets.length > 1, labels: { color: colours.fg } },
          tooltip: { enabled: true },
        },
      },
    };
  }

  function draw() {
    var source = document.getElementById("report-charts");
    if (!source || typeof window.Chart === "undefined") return;
    drawn.forEach(function (chart) { chart.destroy(); });
    drawn = [];
    var colours = palette();
    JSON.parse(source.textContent).forEach(function (spec) {
      var canvas = document.getElementById(spec.id);
      if (!canvas) return;
      // a horizontal chart grows with its rows, so no label is squeezed out
      if (spec.horizontal) {
        canvas.parentElement.style.height = Math.max(10, 3 + spec.labels.length * 2.2) + "rem";
      }
      drawn.push(new window.Chart(canvas, config(spec, colours)));
    });
    document.getElementById("reports").dataset.chartsDrawn = String(drawn.length);
  }

  document.addEventListener("DOMContentLoaded", draw);
  if (window.matchMedia) {
    var dark = window.matchMedia("(prefers-color-scheme: dark)");
    if (dark.addEventListener) dark.addEventListener("change", draw);
  }
})();
