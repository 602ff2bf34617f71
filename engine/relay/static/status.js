/* The status page's live part (engine/relay/web.py serves it at /static/status.js).
   Every few seconds it reads /stats.json and redraws the numbers and the two charts; every
   half minute it reads /stats/peers.json and lists the day's top contributors, and /stats/results.json and
   fills the table of how far each model got.
   Text from the server is only ever set with textContent: nothing is parsed as HTML. */
(function () {
  "use strict";

  var POLL_MS = 3000;
  var BOARD_MS = 30000;
  var BOARD_SHOWN = 10;
  var RESULTS_SHOWN = 25;
  var HOUR_S = 3600;
  var DAY_S = 24 * HOUR_S;
  var CHART_HEIGHT = 180;
  var charts = {};

  function setText(id, value) {
    var el = document.getElementById(id);
    if (el !== null) {
      el.textContent = String(value);
    }
  }

  function rounded(x) {
    return String(Math.round(Number(x) * 10) / 10);
  }

  // The server sends only the minutes that had publishes; the charts want every minute from
  // the first one (at least an hour back, at most a day) to now, with no bar and no reward between.
  function dense(series, now) {
    var last = Math.floor(now / 60) * 60;
    var first = last - HOUR_S;
    if (series.minute.length > 0 && series.minute[0] < first) {
      first = Math.max(series.minute[0], last - DAY_S + 60);
    }
    var index = {};
    for (var i = 0; i < series.minute.length; i++) {
      index[series.minute[i]] = i;
    }
    var xs = [], rollouts = [], reward = [];
    for (var t = first; t <= last; t += 60) {
      var j = index[t];
      xs.push(t);
      rollouts.push(j === undefined || series.rollouts[j] === 0 ? null : series.rollouts[j]);  // no bar, not a flat one
      reward.push(j === undefined ? null : series.reward[j]);
    }
    return { xs: xs, rollouts: rollouts, reward: reward };
  }

  // The chart fills its box (less the box's own padding), so the page never scrolls sideways, even at 320 px.
  function plotWidth(el) {
    var style = window.getComputedStyle(el);
    var inner = el.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    return Math.max(120, Math.floor(inner));
  }

  // id: the element; yRange: uPlot's range function; bars: draw bars (counts) instead of a line with points.
  function chart(id, label, color, yRange, bars) {
    var el = document.getElementById(id);
    if (el === null || typeof uPlot === "undefined") {
      return null;
    }
    var options = {
      width: plotWidth(el),
      height: CHART_HEIGHT,
      legend: { show: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: yRange } },
      series: [
        {},
        bars
          ? { label: label, stroke: color, width: 1, fill: color + "99", paths: uPlot.paths.bars({ size: [0.8, 12] }),
              points: { show: false } }
          : { label: label, stroke: color, width: 2, spanGaps: false,
              points: { show: true, size: 5, stroke: color, fill: color } }
      ],
      axes: [{ stroke: "#555", grid: { stroke: "#eee" } }, { stroke: "#555", grid: { stroke: "#eee" } }]
    };
    var plot = new uPlot(options, [[], []], el);
    window.addEventListener("resize", function () {
      plot.setSize({ width: plotWidth(el), height: CHART_HEIGHT });
    });
    return plot;
  }

  function update(data) {
    var live = data.live;
    setText("peers-online", live.peers_online);
    setText("rollouts-per-minute", rounded(live.rollouts_per_minute));
    setText("batches-last-hour", live.batches_last_hour);
    setText("joined-today", live.joined_today);
    var d = dense(data.series, data.now);
    if (charts.rollouts) {
      charts.rollouts.setData([d.xs, d.rollouts]);
    }
    if (charts.reward) {
      charts.reward.setData([d.xs, d.reward]);
    }
    setText("status-line", "Updated " + new Date(data.now * 1000).toLocaleTimeString() + ".");
  }

  // The credit board: names and counts from the server, set as text.
  function showBoard(data) {
    var list = document.getElementById("contributors");
    if (list === null || !data || !Array.isArray(data.peers)) {
      return;
    }
    var peers = data.peers.slice(0, BOARD_SHOWN);
    if (peers.length === 0) {
      return;  // keep the page's own "nobody yet" line
    }
    while (list.firstChild) {
      list.removeChild(list.firstChild);
    }
    peers.forEach(function (peer) {
      var day = peer.day || {};
      var item = document.createElement("li");
      var name = document.createElement("strong");
      name.textContent = String(peer.name || String(peer.peer).slice(0, 8));
      var count = document.createElement("span");
      count.className = "count";
      var used = Number(day.used) || 0, by = Number(day.peers) || 0;
      count.textContent = " · " + used + (used === 1 ? " rollout" : " rollouts") + " used by " + by +
        (by === 1 ? " peer" : " peers");
      var same = Number(day.same_address) || 0;  // receipts from its own address: not credited (docs/protocol.md)
      if (same > 0) {
        count.textContent += " · " + same + " more from its own address, not counted";
        item.className = "same-address";
      }
      item.appendChild(name);
      item.appendChild(count);
      list.appendChild(item);
    });
  }

  function percent(x) {
    return Math.round(Number(x) * 100) + "%";
  }

  function cell(row, text, className) {
    var td = document.createElement("td");
    td.textContent = String(text);
    if (className) {
      td.className = className;
    }
    row.appendChild(td);
    return td;
  }

  // The results table: each key's best result, re-scored by the relay (its latest below it when it differs).
  function showResults(data) {
    var body = document.querySelector("#results tbody");
    if (body === null || !data || !Array.isArray(data.results) || data.results.length === 0) {
      return;  // keep the page's own "no results yet" line
    }
    setText("results-checked", String(data.checked || "") + " " + String(data.not_checked || ""));
    while (body.firstChild) {
      body.removeChild(body.firstChild);
    }
    data.results.slice(0, RESULTS_SHOWN).forEach(function (entry) {
      var best = entry.best || {}, latest = entry.latest || {};
      var row = document.createElement("tr");
      cell(row, entry.name || String(entry.peer).slice(0, 8));
      var acc = cell(row, percent(best.accuracy) + " (" + percent(best.low) + "–" + percent(best.high) + ")",
        "number");
      if (latest.ts !== best.ts) {
        var note = document.createElement("div");
        note.className = "latest";
        note.textContent = "latest " + percent(latest.accuracy) + " at round " + latest.round;
        acc.appendChild(note);
      }
      cell(row, best.correct + " of " + best.questions, "number");
      cell(row, best.round, "number");
      cell(row, best.model || "not said", "model");
      body.appendChild(row);
    });
  }

  function pollResults() {
    fetch("/stats/results.json", { cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(showResults)
      .catch(function () { /* the numbers above say when the relay is away */ })
      .then(function () {
        window.setTimeout(pollResults, BOARD_MS);
      });
  }

  function pollBoard() {
    fetch("/stats/peers.json", { cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(showBoard)
      .catch(function () { /* the numbers above say when the relay is away */ })
      .then(function () {
        window.setTimeout(pollBoard, BOARD_MS);
      });
  }

  function poll() {
    fetch("/stats.json", { cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("the relay answered " + response.status);
        }
        return response.json();
      })
      .then(update)
      .catch(function () {
        setText("status-line", "Lost contact with the relay; trying again.");
      })
      .then(function () {
        window.setTimeout(poll, POLL_MS);
      });
  }

  charts.rollouts = chart("chart-rollouts", "rollouts", "#2e7d32", function (u, min, max) {
    return [0, max > 0 ? Math.ceil(max * 1.1) : 1];
  }, true);
  charts.reward = chart("chart-reward", "reward", "#1565c0", function () { return [0, 1]; }, false);
  poll();
  pollBoard();
  pollResults();
})();
