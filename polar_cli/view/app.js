// polar view: the session list and the session pages of one self-contained file (polar_cli/view/render.py).
// Every piece of session content is written as escaped text (esc) or through textContent: it is untrusted.
(function () {
  "use strict";
  var CHUNK = 2000;   // tokens drawn at a time (all=1 draws every token at once)
  var PAGE = 200;     // list rows drawn at a time
  var ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  function esc(s) { return String(s).replace(/[&<>"']/g, function (c) { return ESC[c]; }); }
  function num(v) { return typeof v === "number" && isFinite(v) ? v : null; }
  function fmtNum(v) { v = num(v); return v === null ? "" : String(Math.round(v * 1000) / 1000); }
  function cls(s) { return String(s == null ? "" : s).replace(/[^A-Za-z0-9_-]/g, ""); }
  function json(id) { var el = document.getElementById(id); return el ? JSON.parse(el.textContent) : undefined; }

  var HEAD = json("polar-header");
  var INDEX = json("polar-index");
  var BYID = new Map();
  INDEX.forEach(function (r) { BYID.set(r.id, r.i); });

  // ---- byte-level BPE token strings (GPT-2 alphabet: "Ġ" = space, "Ċ" = newline) back to text ----
  var B2U = (function () {
    var bs = [], b, n = 0, m = new Map();
    for (b = 33; b <= 126; b++) bs.push(b);
    for (b = 161; b <= 172; b++) bs.push(b);
    for (b = 174; b <= 255; b++) bs.push(b);
    var cs = bs.slice();
    for (b = 0; b < 256; b++) if (bs.indexOf(b) < 0) { bs.push(b); cs.push(256 + n); n++; }
    bs.forEach(function (x, i) { m.set(String.fromCharCode(cs[i]), x); });
    return m;
  })();
  var UTF8 = new TextDecoder("utf-8");
  function byteLevel(s) {
    var out = new Uint8Array(s.length * 2), j = 0;
    for (var k = 0; k < s.length; k++) {
      var b = B2U.get(s[k]);
      if (b === undefined) return s;
      out[j++] = b;
    }
    return UTF8.decode(out.subarray(0, j));
  }
  function isByteLevel(list) {
    if (!list) return false;
    for (var k = 0; k < list.length; k++) { if (list[k] && /[\u0100-\u0143]/.test(list[k])) return true; }
    return false;
  }
  function showText(raw, bl) {
    var s = bl ? byteLevel(raw) : raw.replace(/\u2581/g, " ");
    if (s === "") return "\u2205";
    return s.replace(/\n/g, "\u21b5\n");
  }

  // ---- page skeleton ----
  document.body.insertAdjacentHTML("afterbegin",
    '<header class="top"><h1>polar view</h1><span class="src"></span></header>' +
    '<main><section id="list"></section><section id="session" hidden></section></main><div id="tip"></div>');
  document.querySelector("header.top .src").textContent =
    HEAD.kind + ": " + HEAD.source + " \u00b7 " + INDEX.length + " sessions \u00b7 polar " + HEAD.version;
  document.title = HEAD.title;
  var LIST = document.getElementById("list"), SESSION = document.getElementById("session");
  var TIP = document.getElementById("tip");

  // ---- session list: filters, search, sort, drawn a page at a time ----
  var COLUMNS = [["id", "session"], ["task", "task"], ["st", "status"], ["r", "reward", 1], ["h", "harness"],
    ["m", "model"], ["c", "completions", 1], ["ch", "chains", 1], ["tt", "trainable tokens", 1], ["err", "error"]];
  var list = { rows: INDEX, shown: 0, sort: "i", dir: 1 };
  function options(key) {
    var seen = new Set();
    INDEX.forEach(function (r) { if (r[key] != null) seen.add(String(r[key])); });
    return Array.from(seen).sort().map(function (v) { return '<option value="' + esc(v) + '">' + esc(v) + "</option>"; }).join("");
  }
  LIST.innerHTML =
    '<div class="filters"><input type="search" id="q" placeholder="search id, task, harness, model, error" aria-label="search">' +
    '<select id="f-st" aria-label="status"><option value="">any status</option>' + options("st") + "</select>" +
    '<select id="f-h" aria-label="harness"><option value="">any harness</option>' + options("h") + "</select>" +
    '<select id="f-m" aria-label="model"><option value="">any model</option>' + options("m") + "</select>" +
    '<label><input type="checkbox" id="f-tt"> with trainable tokens</label>' +
    '<span class="count" id="count"></span></div>' +
    '<table class="sessions"><thead><tr>' + COLUMNS.map(function (c) {
      return '<th data-key="' + c[0] + '"' + (c[2] ? ' class="num"' : "") + ">" + c[1] + "</th>";
    }).join("") + '</tr></thead><tbody id="rows"></tbody></table><div class="sentinel" id="more-rows"></div>';
  var TBODY = document.getElementById("rows"), MORE_ROWS = document.getElementById("more-rows");

  function rowHtml(r) {
    var err = r.err == null ? "" : esc(r.err);
    return '<tr data-session-id="' + esc(r.id) + '" tabindex="0"><td class="mono">' + esc(r.id) + "</td><td>" +
      esc(r.task == null ? "" : r.task) + '</td><td><span class="st st-' + cls(r.st) + '">' + esc(r.st) +
      '</span></td><td class="num">' + fmtNum(r.r) + "</td><td>" + esc(r.h == null ? "" : r.h) + "</td><td>" +
      esc(r.m == null ? "" : r.m) + '</td><td class="num">' + fmtNum(r.c) + '</td><td class="num">' + fmtNum(r.ch) +
      '</td><td class="num">' + fmtNum(r.tt) + '</td><td class="err" title="' + err + '">' + err + "</td></tr>";
  }
  function drawRows() {
    var end = Math.min(list.rows.length, list.shown + PAGE), html = [];
    for (var k = list.shown; k < end; k++) html.push(rowHtml(list.rows[k]));
    TBODY.insertAdjacentHTML("beforeend", html.join(""));
    list.shown = end;
    MORE_ROWS.textContent = end < list.rows.length ? "showing " + end + " of " + list.rows.length + ", scroll for more" : "";
  }
  function applyFilters() {
    var q = document.getElementById("q").value.trim().toLowerCase();
    var st = document.getElementById("f-st").value, h = document.getElementById("f-h").value;
    var m = document.getElementById("f-m").value, tt = document.getElementById("f-tt").checked;
    var rows = INDEX.filter(function (r) {
      if (st && r.st !== st) return false;
      if (h && String(r.h) !== h) return false;
      if (m && String(r.m) !== m) return false;
      if (tt && !(r.tt > 0)) return false;
      if (q) {
        var hay = [r.id, r.task, r.h, r.m, r.st, r.err].join("\u0000").toLowerCase();
        if (hay.indexOf(q) < 0) return false;
      }
      return true;
    });
    var key = list.sort, dir = list.dir;
    if (key !== "i" || dir !== 1) {
      rows.sort(function (a, b) {
        var x = a[key], y = b[key];
        if (x == null && y == null) return a.i - b.i;
        if (x == null) return 1;
        if (y == null) return -1;
        return (x < y ? -1 : x > y ? 1 : a.i - b.i) * dir;
      });
    }
    list.rows = rows; list.shown = 0;
    TBODY.textContent = "";
    document.getElementById("count").textContent = rows.length + " of " + INDEX.length + " sessions";
    drawRows();
  }
  var timer = 0;
  LIST.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(applyFilters, 80); });
  LIST.querySelector("thead").addEventListener("click", function (e) {
    var th = e.target.closest("th[data-key]");
    if (!th) return;
    var key = th.getAttribute("data-key");
    list.dir = list.sort === key ? -list.dir : 1; list.sort = key;
    applyFilters();
  });
  function openRow(e) {
    var tr = e.target.closest("tr[data-session-id]");
    if (tr) location.hash = "session=" + encodeURIComponent(tr.getAttribute("data-session-id"));
  }
  TBODY.addEventListener("click", openRow);
  TBODY.addEventListener("keydown", function (e) { if (e.key === "Enter") openRow(e); });

  // ---- lazy drawing: list pages, chain streams, token chunks ----
  var parts = new Map();  // element -> token part being drawn
  var lazy = new IntersectionObserver(function (entries) {
    entries.forEach(function (en) {
      if (!en.isIntersecting) return;
      var el = en.target;
      if (el === MORE_ROWS) { if (list.shown < list.rows.length) drawRows(); return; }
      var part = parts.get(el);
      if (part) drawPart(part, CHUNK);
    });
  }, { rootMargin: "400px" });
  lazy.observe(MORE_ROWS);

  // ---- session page ----
  var cache = new Map();
  function detail(i) {
    if (cache.has(i)) return cache.get(i);
    var el = document.getElementById("polar-s" + i);
    // while the page is still loading, a block is complete once the parser has gone past it
    if (!el || (document.readyState === "loading" && !el.nextSibling)) return undefined;
    var d = JSON.parse(el.textContent);
    if (d !== undefined) { cache.set(i, d); if (cache.size > 16) cache.delete(cache.keys().next().value); }
    return d;
  }
  var CAUSES = {
    new_context: "new context", history_rewritten: "compaction or rewritten history",
    history_rerendered: "history re-rendered by the chat template", same_prompt: "same prompt again (retry or parallel sample)",
    no_end_of_turn: "previous turn not closed", other_branch: "continues another branch",
    truncated_reply: "previous reply was cut (max_tokens) and sent back as text",
    reasoning_dropped: "earlier reasoning left out of the prompt"
  };
  var RUN_SHOWN = 12;
  function runHtml(ids, texts) {
    if (!ids || !ids.length) return '<span class="count">(nothing)</span>';
    var shown = ids.slice(0, RUN_SHOWN).map(function (id, j) {
      var t = texts && texts[j] != null ? " " + JSON.stringify(texts[j]) : "";
      return esc(String(id) + t);
    });
    return '<span class="mono">[' + shown.join(", ") + (ids.length > RUN_SHOWN ? ", \u2026" : "") + "]</span>";
  }
  function departureHtml(start, tr) {
    if (start.at == null) return "";
    var found = tr.ptok && start.found ? tr.ptok.slice(start.at, start.at + start.found.length) : null;
    return '<div class="departure">its prompt departs at token ' + fmtNum(start.at) + ": expected " +
      runHtml(start.expected, null) + ", found " + runHtml(start.found, found) + "</div>";
  }
  function causeLabel(start, role) {
    if (start.cause === "new_context") {
      if (role === "subagent") return "sub-agent (new context)";
      if (role === "side") return "side call (new context)";
    }
    return CAUSES[start.cause] || start.cause;
  }
  function statusClass(s) {
    if (/^(pass|passed|ok|success|succeeded|resolved)$/i.test(s)) return "pass";
    if (/^(fail|failed|failure|error|errored|unresolved)$/i.test(s)) return "fail";
    return "";
  }
  function valueHtml(v, depth) {
    if (v === null || v === undefined) return '<span class="count">\u2014</span>';
    if (typeof v === "string") {
      if (v.indexOf("\n") >= 0 || v.length > 120) return "<pre>" + esc(v) + "</pre>";
      var c = statusClass(v);
      return c ? '<span class="' + c + '">' + esc(v) + "</span>" : esc(v);
    }
    if (typeof v !== "object") return esc(String(v));
    if (depth > 6) return "<pre>" + esc(JSON.stringify(v)) + "</pre>";
    if (Array.isArray(v)) {
      if (!v.length) return "[]";
      if (v.every(function (x) { return x && typeof x === "object" && !Array.isArray(x); })) {
        var keys = [];
        v.forEach(function (x) { Object.keys(x).forEach(function (k) { if (keys.indexOf(k) < 0) keys.push(k); }); });
        return '<table class="kv"><tr>' + keys.map(function (k) { return "<th>" + esc(k) + "</th>"; }).join("") + "</tr>" +
          v.map(function (x) {
            return "<tr>" + keys.map(function (k) { return "<td>" + valueHtml(x[k], depth + 1) + "</td>"; }).join("") + "</tr>";
          }).join("") + "</table>";
      }
      return v.map(function (x) { return valueHtml(x, depth + 1); }).join(", ");
    }
    var ks = Object.keys(v);
    if (!ks.length) return "{}";
    return '<table class="kv">' + ks.map(function (k) {
      return "<tr><th>" + esc(k) + "</th><td>" + valueHtml(v[k], depth + 1) + "</td></tr>";
    }).join("") + "</table>";
  }
  function block(title, body, open) {
    return '<section class="block"><h2>' + title + '</h2><div class="body">' + body + "</div></section>";
  }
  function textOf(content) {
    if (content == null) return "";
    if (typeof content === "string") return content;
    if (Array.isArray(content)) {
      return content.map(function (p) {
        if (typeof p === "string") return p;
        if (p && typeof p.text === "string") return p.text;
        return "[" + (p && p.type ? p.type : "part") + "]";
      }).join("");
    }
    return JSON.stringify(content);
  }
  function longText(s) {
    if (s.length <= 1500) return "<pre>" + esc(s) + "</pre>";
    return "<details><summary><pre>" + esc(s.slice(0, 300)) + "\u2026 (" + s.length + " characters)</pre></summary><pre>" +
      esc(s) + "</pre></details>";
  }
  function messageHtml(m) {
    if (!m || typeof m !== "object") return "";
    var head = esc(m.role == null ? "?" : m.role);
    if (m.name) head += " \u00b7 " + esc(m.name);
    if (m.tool_call_id) head += " \u00b7 result of " + esc(m.tool_call_id);
    var html = '<div class="msg ' + cls(m.role) + '"><div class="role">' + head + "</div>";
    var reasoning = m.reasoning_content || m.reasoning;
    if (typeof reasoning === "string" && reasoning) html += "<details><summary>reasoning</summary><pre>" + esc(reasoning) + "</pre></details>";
    var text = textOf(m.content);
    if (text) html += longText(text);
    (Array.isArray(m.tool_calls) ? m.tool_calls : []).forEach(function (c) {
      var fn = (c && c.function) || {}, args = fn.arguments;
      if (typeof args === "string") { try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* raw */ } }
      else args = JSON.stringify(args, null, 2);
      html += '<div class="call">tool call <b>' + esc(fn.name == null ? "?" : fn.name) + '</b> <span class="mono count">' +
        esc(c && c.id != null ? c.id : "") + "</span><pre>" + esc(args == null ? "" : args) + "</pre></div>";
    });
    return html + "</div>";
  }
  function tokenHtml(part, k) {
    var tr = part.tr;
    if (part.prompt) {
      var praw = tr.ptok ? tr.ptok[k] : null;
      var ptext = praw == null ? "\u27e8" + tr.pids[k] + "\u27e9 " : showText(praw, part.bl);
      return '<span class="t' + (praw == null ? " id" : "") + '" data-part="prompt" data-mask="0" data-logprob="" data-i="' + k + '">' +
        esc(ptext) + "</span>";
    }
    var m = tr.mask.charCodeAt(k) === 49 ? 1 : 0;
    var lp = tr.lp ? tr.lp[k] : null;
    var c = "t";
    if (m && lp !== null) c += " h" + Math.min(9, Math.max(0, Math.floor((1 - Math.exp(lp)) * 10)));
    var raw = tr.tok ? tr.tok[k] : null;
    if (raw == null) c += " id";
    var text = raw == null ? "\u27e8" + tr.ids[k] + "\u27e9 " : showText(raw, part.bl);
    return '<span class="' + c + '" data-mask="' + m + '" data-logprob="' + (lp === null ? "" : lp) + '" data-i="' + k + '">' +
      esc(text) + "</span>";
  }
  function drawPart(part, n) {
    var end = Math.min(part.total, part.drawn + n), html = [];
    for (var k = part.drawn; k < end; k++) html.push(tokenHtml(part, k));
    part.el.insertAdjacentHTML("beforeend", html.join(""));
    part.drawn = end;
    if (end >= part.total) { lazy.unobserve(part.more); parts.delete(part.more); part.more.remove(); }
    else part.more.textContent = "draw " + Math.min(CHUNK, part.total - end) + " more (" + (part.total - end) + " left)";
  }
  function chainHtml(tr, k) {
    var role = tr.role || "unknown role", mask = tr.mask, trainable = 0;
    for (var j = 0; j < mask.length; j++) if (mask.charCodeAt(j) === 49) trainable++;
    var start = tr.start, boundary;
    if (k === 0 && !start) boundary = '<div class="boundary first" data-cause="start">chain 0 \u00b7 the session\u2019s first call</div>';
    else if (start) {
      boundary = '<div class="boundary" data-cause="' + esc(start.cause) + '">chain ' + k + " began: <b>" + esc(causeLabel(start, tr.role)) +
        "</b>" + (start.from != null ? " \u00b7 closest chain " + esc(start.from) + ", sharing " + fmtNum(start.shared) + " of its " +
        fmtNum(start.of) + " prompt tokens" : "") + (start.completion != null ? " \u00b7 at completion " + fmtNum(start.completion) : "") +
        " \u00b7 cause <span class=\"mono\">" + esc(start.cause) + "</span>" + departureHtml(start, tr) + "</div>";
    } else boundary = '<div class="boundary" data-cause="unknown">chain ' + k + " (no break recorded)</div>";
    var msgs = "";
    if (tr.pm && tr.pm.length) msgs += '<div class="part-label">prompt (' + tr.pm.length + " messages)</div>" + tr.pm.map(messageHtml).join("");
    if (tr.rm && tr.rm.length) msgs += '<div class="part-label">' + (tr.pm && tr.pm.length ? "response" : "messages") +
      " (" + tr.rm.length + " messages)</div>" + tr.rm.map(messageHtml).join("");
    return boundary + '<section class="block chain" data-chain="' + k + '" data-role="' + esc(role) + '" data-trainable-tokens="' +
      trainable + '"><h3>chain ' + k + " \u00b7 " + esc(role) + (tr.why ? ' <span class="count">(' + esc(tr.why) + ")</span>" : "") +
      " \u00b7 " + (tr.trainable ? "trainable" : "not trainable") +
      (tr.exact === false ? ' \u00b7 <span class="inexact" title="built with merge: prompt_prefix: some sampled tokens ' +
        'follow a context other than the one they were sampled in">context not exact</span>' : "") +
      (tr.reward != null ? " \u00b7 reward " + fmtNum(tr.reward) : "") +
      (tr.finish ? " \u00b7 finish " + esc(tr.finish) : "") + " \u00b7 " + tr.pids.length + " prompt + " + tr.ids.length +
      " response tokens, " + trainable + " trainable" + (tr.tools ? " \u00b7 " + tr.tools + " tools" : "") + "</h3>" +
      '<div class="body"><div class="legend"><span><span class="sw h0"></span>\u2026<span class="sw h9"></span> mask 1 (sampled, trained): ' +
      'probability high \u2192 low</span><span><span class="sw" style="background:#e7e9ee"></span> mask 0 (not trained)</span>' +
      '<label><input type="checkbox" class="heat" checked> heat</label></div><div class="chain-grid">' +
      '<div class="stream" data-chain="' + k + '"><button class="show" type="button">prompt: ' + tr.pids.length +
      " tokens (draw)</button><span class=\"ptoks\"></span><span class=\"rtoks\"></span>" +
      '<button class="more" type="button"></button></div><div class="msgs">' + (msgs || '<div class="empty">no messages</div>') +
      "</div></div></div></section>";
  }
  function setupChain(section, tr, all) {
    var stream = section.querySelector(".stream");
    var bl = isByteLevel(tr.tok) || isByteLevel(tr.ptok);
    var resp = { tr: tr, prompt: false, bl: bl, el: stream.querySelector(".rtoks"), more: stream.querySelector("button.more"),
      drawn: 0, total: tr.ids.length };
    var show = stream.querySelector("button.show");
    function drawPrompt(everything) {
      var more = document.createElement("button");
      more.className = "more"; more.type = "button";
      show.replaceWith(more);
      var p = { tr: tr, prompt: true, bl: bl, el: stream.querySelector(".ptoks"), more: more, drawn: 0, total: tr.pids.length };
      parts.set(more, p);
      more.addEventListener("click", function () { drawPart(p, CHUNK); });
      drawPart(p, everything ? p.total : CHUNK);
      if (p.drawn < p.total) lazy.observe(more);
    }
    show.addEventListener("click", function () { drawPrompt(false); });
    parts.set(resp.more, resp);
    resp.more.addEventListener("click", function () { drawPart(resp, CHUNK); });
    if (all) { drawPrompt(true); drawPart(resp, resp.total); }
    else { drawPart(resp, Math.min(CHUNK, 300)); if (resp.drawn < resp.total) lazy.observe(resp.more); }
    section.querySelector("input.heat").addEventListener("change", function (e) { stream.classList.toggle("noheat", !e.target.checked); });
    stream.addEventListener("mouseover", function (e) { tip(e, stream, tr, resp); });
    stream.addEventListener("mousemove", moveTip);
    stream.addEventListener("mouseleave", function () { TIP.style.display = "none"; });
  }
  function tip(e, stream, tr, resp) {
    var t = e.target.closest ? e.target.closest(".t") : null;
    if (!t) { TIP.style.display = "none"; return; }
    var k = Number(t.getAttribute("data-i")), lines;
    if (t.getAttribute("data-part") === "prompt") {
      var pr = tr.ptok ? tr.ptok[k] : null;
      lines = ["prompt token " + k + "  id " + tr.pids[k], pr == null ? "" : "token " + JSON.stringify(pr), "not in the loss mask"];
    } else {
      var raw = tr.tok ? tr.tok[k] : null, lp = tr.lp ? tr.lp[k] : null, m = t.getAttribute("data-mask");
      lines = ["response token " + k + "  id " + tr.ids[k], raw == null ? "no text recorded" : "token " + JSON.stringify(raw),
        m === "1" ? (lp === null ? "no logprob recorded" : "logprob " + lp + "  (p " + Math.exp(lp).toFixed(4) + ")") : "logprob placeholder " + lp,
        m === "1" ? "mask 1: sampled by the policy, trained" : "mask 0: template, tool result or user text, not trained"];
    }
    TIP.textContent = lines.filter(Boolean).join("\n");
    TIP.style.display = "block";
    moveTip(e);
  }
  function moveTip(e) {
    var x = Math.min(e.clientX + 14, window.innerWidth - TIP.offsetWidth - 8);
    TIP.style.left = x + "px"; TIP.style.top = (e.clientY + 16) + "px";
  }

  function renderSession(d, all) {
    parts.forEach(function (p, el) { if (el !== MORE_ROWS) lazy.unobserve(el); });
    parts.clear();
    var facts = [["status", '<span class="st st-' + cls(d.status) + '">' + esc(d.status) + "</span>"], ["reward", fmtNum(d.reward) || "\u2014"],
      ["task", esc(d.task == null ? "\u2014" : d.task)], ["sample", fmtNum(d.sample)], ["harness", esc(d.harness == null ? "\u2014" : d.harness)],
      ["model", esc(d.model == null ? "\u2014" : d.model)], ["completions", fmtNum(d.completions)], ["chains", String(d.traces.length)],
      ["trainable tokens", String(INDEX[BYID.get(d.id)].tt)]];
    if (d.accepted != null) facts.push(["accepted", d.accepted ? "yes" : "no"]);
    if (d.split) facts.push(["split", esc(d.split)]);
    if (d.stages && num(d.stages.total) !== null) facts.push(["seconds", fmtNum(d.stages.total)]);
    var html = '<div><a href="#" class="back">\u2190 all sessions</a><b class="mono" id="session-title"></b></div><div class="facts">' +
      facts.map(function (f) { return "<div><span>" + f[0] + "</span>" + f[1] + "</div>"; }).join("") + "</div>";
    if (d.error) html += '<pre class="error">' + esc(d.error) + "</pre>";
    html += block("evaluator report", d.evaluation ? valueHtml(d.evaluation, 0) : '<span class="count">none recorded</span>');
    var rest = "";
    if (d.tmeta && Object.keys(d.tmeta).length) rest += "<h4>trajectory</h4>" + valueHtml(d.tmeta, 0);
    if (d.meta && Object.keys(d.meta).length) rest += "<h4>session metadata</h4>" + valueHtml(d.meta, 0);
    if (d.stages && Object.keys(d.stages).length) rest += "<h4>stage seconds</h4>" + valueHtml(d.stages, 0);
    if (d.stderr) rest += "<h4>harness stderr</h4>" + longText(d.stderr);
    if (rest) html += '<section class="block"><h2>details</h2><div class="body"><details><summary>trajectory stats, metadata, stages' +
      (d.stderr ? ", harness stderr" : "") + "</summary>" + rest + "</details></div></section>";
    html += '<div id="chains">' + (d.traces.length ? d.traces.map(chainHtml).join("") : '<div class="empty">no traces</div>') + "</div>";
    SESSION.innerHTML = html;
    document.getElementById("session-title").textContent = " " + d.id;
    SESSION.querySelectorAll("section.chain").forEach(function (section, k) { setupChain(section, d.traces[k], all); });
  }

  // ---- routing: #session=<id>[&all=1] ----
  function ready(what) {
    document.documentElement.setAttribute("data-ready", what);
    performance.mark("polar-" + what);
  }
  var pending = 0;
  function route() {
    var params = new URLSearchParams(location.hash.slice(1)), id = params.get("session");
    document.documentElement.removeAttribute("data-ready");
    if (id === null) {
      SESSION.hidden = true; LIST.hidden = false; SESSION.textContent = "";
      document.title = HEAD.title;
      ready("list");
      return;
    }
    var i = BYID.get(id);
    LIST.hidden = true; SESSION.hidden = false;
    if (i === undefined) { SESSION.innerHTML = '<div class="empty">no session <b class="mono"></b> here. <a href="#">all sessions</a></div>';
      SESSION.querySelector("b").textContent = id; ready("session"); return; }
    var d = detail(i);
    if (d === undefined) {  // its block is not parsed yet: look again soon
      if (!SESSION.querySelector(".loading")) SESSION.innerHTML = '<div class="empty loading">loading\u2026</div>';
      clearTimeout(pending); pending = setTimeout(route, 15);
      return;
    }
    document.title = id + " \u00b7 " + HEAD.title;
    renderSession(d, params.get("all") === "1");
    window.scrollTo(0, 0);
    ready("session");
  }
  window.addEventListener("hashchange", route);
  applyFilters();
  route();
})();
