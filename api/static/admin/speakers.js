// Diarist admin job page: the speaker timeline ("who spoke when"). Draws diarist.speaker_timeline's JSON
// (#speaker-data: lanes, bars, turns, overlaps) as SVG: one lane per speaker, a bar per segment, the
// diarization's turns pale behind them, overlaps in a red strip, a time axis. Zoom with the buttons or
// Ctrl + wheel, pan by dragging or with the slider; a click on a bar shows its text. Every element is made
// once; a redraw only moves them (thousands of segments stay smooth), at most once per animation frame.
(function () {
  "use strict";
  var seed = document.getElementById("speaker-data");
  var svg = document.getElementById("speaker-timeline");
  if (!seed || !svg) return;
  var d = JSON.parse(seed.textContent);
  var NS = "http://www.w3.org/2000/svg";
  var LABEL_W = 150, RIGHT = 30, TOP = 6, LANE_H = 28, BAR_H = 18, STRIP_H = 10, AXIS_H = 24;
  var MIN_SPAN_S = 5;  // the closest zoom shows 5 s across the plot
  var OVERLAP = "#e5484d";
  var duration = Math.max(d.duration, 0.001);
  var nLanes = Math.max(1, d.lanes.length);
  var stripY = TOP + nLanes * LANE_H + 4, axisY = stripY + STRIP_H + 4;
  var view = { start: 0, span: duration };
  var detail = document.getElementById("spk-detail");
  var pan = document.getElementById("spk-pan");
  var viewText = document.getElementById("spk-view");

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  function clock(s, decimals) {  // diarist.speaker_timeline.clock: mm:ss (h:mm:ss), tenths truncated
    s = Math.max(0, s);
    if (decimals) s = Math.floor(s * 10 + 1e-9) / 10;
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    var ss = (sec < 10 ? "0" : "") + (decimals ? sec.toFixed(1) : String(Math.floor(sec)));
    var mm = (m < 10 ? "0" : "") + m;
    return h ? h + ":" + mm + ":" + ss : mm + ":" + ss;
  }

  while (svg.firstChild) svg.removeChild(svg.firstChild);
  svg.setAttribute("height", axisY + AXIS_H);
  var defs = el("defs", {}, svg);
  var clip = el("clipPath", { id: "spk-clip" }, defs);
  var clipRect = el("rect", { x: LABEL_W, y: 0, width: 1, height: axisY }, clip);
  var backs = [];
  d.lanes.forEach(function (lane, i) {
    backs.push(el("rect", { x: LABEL_W, y: TOP + i * LANE_H, height: LANE_H, fill: i % 2 ? "#ffffff" : "#f4f6f8" }, svg));
    var label = el("text", { x: LABEL_W - 8, y: TOP + i * LANE_H + LANE_H / 2 + 4, "text-anchor": "end",
                             fill: lane.color, "font-weight": "600", class: "spk-lane" }, svg);
    label.textContent = lane.name.length > 20 ? lane.name.slice(0, 19) + "…" : lane.name;
    el("title", {}, label).textContent = lane.speaker && lane.speaker !== lane.name
      ? lane.name + " (" + lane.speaker + ")" : lane.name;
  });
  var stripLabel = el("text", { x: LABEL_W - 8, y: stripY + STRIP_H - 1, "text-anchor": "end", fill: OVERLAP,
                                class: "spk-lane" }, svg);
  stripLabel.textContent = "overlap";
  backs.push(el("rect", { x: LABEL_W, y: stripY, height: STRIP_H, fill: "#f4f6f8" }, svg));
  var plot = el("g", { "clip-path": "url(#spk-clip)" }, svg);
  var axis = el("g", { class: "spk-axis" }, svg);

  function spans(list, y, h, color, opacity, cls) {
    return list.map(function (b, i) {
      var r = el("rect", { y: y(b), height: h, fill: color(b), "fill-opacity": opacity, class: cls }, plot);
      r.setAttribute("data-i", i);
      return { rect: r, start: b[1], end: b[2] };
    });
  }
  var laneColor = function (b) { return d.lanes[b[0]].color; };
  var turns = spans(d.turns, function (b) { return TOP + b[0] * LANE_H + 2; }, LANE_H - 4, laneColor, 0.18, "spk-turn");
  var bars = spans(d.bars, function (b) { return TOP + b[0] * LANE_H + (LANE_H - BAR_H) / 2; }, BAR_H, laneColor,
                   0.85, "spk-bar");
  var overlaps = spans(d.overlaps.map(function (o) { return [0, o[0], o[1]]; }), function () { return stripY; },
                       STRIP_H, function () { return OVERLAP; }, 1, "spk-ov");
  bars.forEach(function (b, i) {
    var lane = d.lanes[d.bars[i][0]];
    el("title", {}, b.rect).textContent = lane.name + " " + clock(b.start, 1) + "–" + clock(b.end, 1);
  });
  if (!d.bars.length) {
    var none = el("text", { x: LABEL_W + 12, y: TOP + LANE_H / 2 + 4, fill: "#6b7785" }, svg);
    none.textContent = "No speech";
  }

  var width = 0, scale = 1, pending = false, selected = null;

  function place(items, plotW) {
    var t0 = view.start, t1 = view.start + view.span;
    for (var i = 0; i < items.length; i++) {
      var it = items[i];
      if (it.end < t0 || it.start > t1) { it.rect.setAttribute("display", "none"); continue; }
      it.rect.removeAttribute("display");
      var x = LABEL_W + (it.start - t0) * scale;
      it.rect.setAttribute("x", x.toFixed(2));
      it.rect.setAttribute("width", Math.max(1, (it.end - it.start) * scale).toFixed(2));  // a short one stays visible
    }
  }

  function drawAxis(plotW) {
    while (axis.firstChild) axis.removeChild(axis.firstChild);
    el("line", { x1: LABEL_W, y1: axisY, x2: LABEL_W + plotW, y2: axisY, stroke: "#9aa5b1" }, axis);
    var maxTicks = Math.max(2, Math.floor(plotW / 90));
    var step = d.tick_steps.find(function (s) { return view.span / s <= maxTicks; })
      || d.tick_steps[d.tick_steps.length - 1] * Math.ceil(view.span / d.tick_steps[d.tick_steps.length - 1] / maxTicks);
    for (var t = Math.ceil(view.start / step) * step; t <= view.start + view.span + 1e-9; t += step) {
      var x = LABEL_W + (t - view.start) * scale;
      el("line", { x1: x, y1: axisY, x2: x, y2: axisY + 5, stroke: "#9aa5b1" }, axis);
      var label = el("text", { x: x, y: axisY + 18, "text-anchor": "middle", fill: "#6b7785" }, axis);
      label.textContent = clock(t, step < 1 ? 1 : 0);
    }
  }

  function draw() {
    pending = false;
    width = svg.clientWidth || svg.getBoundingClientRect().width || 900;
    var plotW = Math.max(50, width - LABEL_W - RIGHT);
    scale = plotW / view.span;
    clipRect.setAttribute("width", plotW);
    backs.forEach(function (r) { r.setAttribute("width", plotW); });
    place(turns, plotW);
    place(bars, plotW);
    place(overlaps, plotW);
    drawAxis(plotW);
    var room = duration - view.span;
    pan.disabled = room <= 0;
    pan.value = room > 0 ? Math.round(1000 * view.start / room) : 0;
    viewText.textContent = clock(view.start) + "–" + clock(view.start + view.span) + " of " + clock(duration);
  }

  function redraw() {
    if (!pending) { pending = true; window.requestAnimationFrame(draw); }
  }

  function setView(start, span) {
    view.span = Math.min(duration, Math.max(Math.min(MIN_SPAN_S, duration), span));
    view.start = Math.min(Math.max(0, start), duration - view.span);
    redraw();
  }

  function zoom(factor, at) {  // ``at``: the time that stays under the pointer (the view's middle if none)
    if (at === undefined) at = view.start + view.span / 2;
    var span = Math.min(duration, Math.max(Math.min(MIN_SPAN_S, duration), view.span * factor));
    setView(at - (at - view.start) * (span / view.span), span);
  }

  function timeAt(clientX) {
    var box = svg.getBoundingClientRect();
    return view.start + (clientX - box.left - LABEL_W) / scale;
  }

  document.getElementById("spk-zoom-in").addEventListener("click", function () { zoom(0.5); });
  document.getElementById("spk-zoom-out").addEventListener("click", function () { zoom(2); });
  document.getElementById("spk-fit").addEventListener("click", function () { setView(0, duration); });
  pan.addEventListener("input", function () { setView((duration - view.span) * pan.value / 1000, view.span); });
  svg.addEventListener("wheel", function (e) {
    if (e.ctrlKey || e.metaKey) {
      e.preventDefault();
      zoom(e.deltaY > 0 ? 1.25 : 0.8, timeAt(e.clientX));
    } else if (Math.abs(e.deltaX) > Math.abs(e.deltaY) || e.shiftKey) {
      e.preventDefault();
      setView(view.start + (e.deltaX || e.deltaY) / scale, view.span);
    }
  }, { passive: false });

  var drag = null;
  svg.addEventListener("pointerdown", function (e) {
    drag = { x: e.clientX, start: view.start, moved: false };
  });
  window.addEventListener("pointermove", function (e) {
    if (!drag) return;
    if (Math.abs(e.clientX - drag.x) > 3) drag.moved = true;
    if (drag.moved) setView(drag.start - (e.clientX - drag.x) / scale, view.span);
  });
  window.addEventListener("pointerup", function () { setTimeout(function () { drag = null; }, 0); });

  svg.addEventListener("click", function (e) {
    if (drag && drag.moved) return;
    var t = e.target;
    if (!t.classList || !t.classList.contains("spk-bar")) return;
    var i = +t.getAttribute("data-i");
    var b = d.bars[i], lane = d.lanes[b[0]];
    if (selected) selected.classList.remove("sel");
    selected = t;
    t.classList.add("sel");
    detail.textContent = "";
    var who = document.createElement("b");
    who.textContent = lane.name;
    who.className = "spk-who";
    var when = document.createElement("span");
    when.className = "time";
    when.textContent = " " + clock(b[1], 1) + "–" + clock(b[2], 1) + " ";
    var text = document.createElement("span");
    text.className = "spk-text";
    text.textContent = d.texts[i];
    detail.appendChild(who);
    detail.appendChild(when);
    detail.appendChild(text);
  });

  window.addEventListener("resize", redraw);
  draw();
})();
