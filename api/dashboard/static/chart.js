/* Small SVG line charts: labelled axes, nice ticks, a budget line, vertical markers, one <g>
   per series whose data-points attribute is its number of points; each dot carries its exact
   coordinates in data-x and data-y. */
"use strict";
const dprcChart = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 640, H = 280, M = { l: 62, r: 16, t: 28, b: 46 };

  function node(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, attrs) {
    const t = node("text", { x, y, ...(attrs || {}) }, parent);
    t.textContent = s;
    return t;
  }
  // about n round ticks covering [lo, hi]
  function ticks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; }
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((f) => f * mag).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
      out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    }
    return out;
  }
  function fmt(v) {
    const a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 1e4 || a < 1e-3) return v.toExponential(1);
    return String(Number(v.toPrecision(4)));
  }

  /* opts: {xLabel, yLabel, series: [{key, label, points: [[x, y]], step, upper, origin, dots, line,
     labels, r, color}], budget: {y, label}, markers: [{x, key, label}], xFormat, empty}.
     step: hold each value until the next point (a step line). upper: between two points more
     than 1 apart in x, rise at once to the later value and hold it (never drawn below the
     later point: a pessimistic interpolation of a non-decreasing curve). origin: [x, y] the
     line starts from, not a point of the series. labels: each dot's value written beside it. */
  function line(container, opts) {
    container.replaceChildren();
    const svg = node("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" }, container);
    node("title", {}, svg).textContent = `${opts.yLabel} against ${opts.xLabel}`;
    const all = opts.series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[1]));
    const markers = opts.markers || [];
    const pw = W - M.l - M.r, ph = H - M.t - M.b;
    if (all.length === 0) {
      text(svg, W / 2, H / 2, opts.empty || "no data yet", { class: "empty", "text-anchor": "middle" });
    }
    let x0 = Math.min(...all.map((p) => p[0]), ...markers.map((m) => m.x), opts.xMin ?? Infinity);
    let x1 = Math.max(...all.map((p) => p[0]), ...markers.map((m) => m.x), opts.xMax ?? -Infinity);
    let y0 = Math.min(0, ...all.map((p) => p[1]));
    let y1 = Math.max(...all.map((p) => p[1]), opts.budget ? opts.budget.y : -Infinity);
    if (!Number.isFinite(x0)) { x0 = 0; x1 = 1; }
    if (!Number.isFinite(y1)) { y1 = 1; }
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) y1 = y0 + 1;
    y1 += (y1 - y0) * 0.06;
    const X = (x) => M.l + ((x - x0) / (x1 - x0)) * pw;
    const Y = (y) => M.t + ph - ((y - y0) / (y1 - y0)) * ph;
    const grid = node("g", { class: "grid" }, svg), axis = node("g", { class: "axis" }, svg);
    for (const v of ticks(y0, y1, 5)) {
      if (v > y1) continue;
      node("line", { x1: M.l, x2: W - M.r, y1: Y(v), y2: Y(v) }, grid);
      text(axis, M.l - 6, Y(v) + 4, fmt(v), { "text-anchor": "end" });
    }
    for (const v of ticks(x0, x1, 6)) {
      node("line", { x1: X(v), x2: X(v), y1: M.t + ph, y2: M.t + ph + 4 }, axis);
      text(axis, X(v), M.t + ph + 17, (opts.xFormat || fmt)(v), { "text-anchor": "middle" });
    }
    node("line", { x1: M.l, x2: W - M.r, y1: M.t + ph, y2: M.t + ph }, axis);
    node("line", { x1: M.l, x2: M.l, y1: M.t, y2: M.t + ph }, axis);
    text(svg, M.l + pw / 2, H - 8, opts.xLabel, { class: "label", "text-anchor": "middle" });
    text(svg, 14, M.t + ph / 2, opts.yLabel,
      { class: "label", "text-anchor": "middle", transform: `rotate(-90 14 ${M.t + ph / 2})` });
    if (opts.budget) {
      const g = node("g", { class: "budget" }, svg);
      node("line", { x1: M.l, x2: W - M.r, y1: Y(opts.budget.y), y2: Y(opts.budget.y) }, g);
      text(g, W - M.r - 4, Y(opts.budget.y) - 5, opts.budget.label, { "text-anchor": "end" });
    }
    markers.forEach((m, i) => {
      const g = node("g", { class: "marker", "data-marker": m.key, "data-x": m.x }, svg);
      node("line", { x1: X(m.x), x2: X(m.x), y1: M.t, y2: M.t + ph }, g);
      const right = X(m.x) > M.l + pw * 0.6;
      text(g, X(m.x) + (right ? -4 : 4), M.t + 12 + 14 * i, m.label, { "text-anchor": right ? "end" : "start" });
    });
    const legend = node("g", { class: "legend" }, svg);
    let lx = M.l;
    opts.series.forEach((s, i) => {
      const pts = s.points.filter((p) => Number.isFinite(p[1]));
      const g = node("g", {
        class: `series s${s.color ?? i}`, "data-series": s.key || s.label, "data-points": pts.length,
      }, svg);
      let d = s.origin && pts.length ? `M${X(s.origin[0])},${Y(s.origin[1])}` : "";
      let prev = s.origin;
      pts.forEach((p) => {
        if (!d) d += `M${X(p[0])},${Y(p[1])}`;
        else if (s.step) d += `H${X(p[0])}V${Y(p[1])}`;
        else if (s.upper && p[0] - prev[0] > 1) d += `V${Y(p[1])}H${X(p[0])}`;
        else d += `L${X(p[0])},${Y(p[1])}`;
        prev = p;
      });
      if (s.step && pts.length && opts.xMax !== undefined) d += `H${X(x1)}`;
      if (d && s.line !== false) node("path", { d }, g);
      if (s.dots !== false) {
        for (const p of pts) {
          const c = node("circle", {
            cx: X(p[0]), cy: Y(p[1]), r: s.r ?? (pts.length > 60 ? 1.6 : 2.6), "data-x": p[0], "data-y": p[1],
          }, g);
          node("title", {}, c).textContent = `${fmt(p[0])}: ${fmt(p[1])}`;
          if (s.labels) {
            const right = X(p[0]) > M.l + pw * 0.75;
            text(g, X(p[0]) + (right ? -7 : 7), Y(p[1]) + 16, p.label || fmt(p[1]),
              { class: "point-label", "text-anchor": right ? "end" : "start" });
          }
        }
      }
      const lg = node("g", { class: `s${s.color ?? i}` }, legend);
      node("path", { d: `M${lx},${M.t - 12}h18` }, lg);
      text(legend, lx + 22, M.t - 8, s.label);
      lx += 32 + 7 * s.label.length;
    });
    return svg;
  }
  return { line, ticks, fmt };
})();
