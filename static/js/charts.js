// Draw every figure the page embedded with json_script: <div id="chart-NAME"> + <script id="NAME">.
(function () {
  "use strict";
  document.querySelectorAll("div.chart").forEach(function (div) {
    const data = document.getElementById(div.id.replace(/^chart-/, ""));
    if (!data || !window.Plotly) return;
    const figure = JSON.parse(data.textContent);
    window.Plotly.newPlot(div, figure.data, figure.layout, { responsive: true, displaylogo: false });
  });
})();
