// shopfloor console: live updates. Pages are complete without this script; with it, a page
// listens to its project's event stream (Server-Sent Events) and, when something it shows
// changed, fetches itself again and swaps the regions marked `data-live` in place, leaving a
// region alone while the person is typing in it. A running crew step's transcript streams its
// lines as they are reported. Relative times ("2 s ago") move on as the page stays open.
(function () {
  'use strict';
  var body = document.body;
  var streams = (body.dataset.streams || '').split(' ').filter(Boolean);
  var run = body.dataset.run || '';
  var status = document.getElementById('live-status');
  var say = function (text) { if (status) status.textContent = text; };
  var timer = null, busy = false, again = false;

  function schedule() {
    if (timer) return;
    timer = setTimeout(refresh, 120);
  }

  function refresh() {
    timer = null;
    if (busy) { again = true; return; }
    busy = true;
    fetch(location.href, { headers: { Accept: 'text/html' }, credentials: 'same-origin' })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html) apply(html); })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) { again = false; schedule(); }
      });
  }

  function busyIn(region) {
    var active = document.activeElement;
    return active && active !== document.body && region.contains(active);
  }

  function apply(html) {
    var doc = new DOMParser().parseFromString(html, 'text/html');
    document.querySelectorAll('[data-live]').forEach(function (old) {
      var fresh = doc.getElementById(old.id);
      if (!fresh || busyIn(old)) return;
      if (old.dataset.liveKey && old.dataset.liveKey === fresh.dataset.liveKey) return;
      old.replaceWith(document.adoptNode(fresh));
    });
    var title = doc.querySelector('title');
    if (title) document.title = title.textContent;
    body.dataset.refreshes = String(Number(body.dataset.refreshes || 0) + 1);
    tail();
  }

  var kinds = ['run.started', 'run.admitted', 'run.held', 'run.awaiting', 'run.wait_expired', 'run.wait_withdrawn',
    'run.completed', 'run.failed', 'run.cancelled', 'step.created', 'step.pending', 'step.leased', 'step.running',
    'step.waiting', 'step.succeeded', 'step.failed', 'step.cancelled', 'step.deferred', 'step.session', 'step.reused',
    'step.unwalled', 'step.egress_refused'];
  function onEvent(e) {
    if (run) {
      try { if (JSON.parse(e.data).run !== run) return; } catch (err) { /* refresh anyway */ }
    }
    schedule();
  }
  // Open streams are closed when the page is left: a browser keeps a few connections per
  // server, and streams of pages left behind (kept in its back-forward cache) would hold them
  // and stall the next page. A page shown again from that cache loads afresh.
  var open = [];
  window.addEventListener('pagehide', function () {
    open.forEach(function (es) { es.close(); });
    open = [];
    if (source) { source.close(); source = null; sourceUrl = ''; }
  });
  window.addEventListener('pageshow', function (e) { if (e.persisted) location.reload(); });
  if (streams.length && window.EventSource) {
    say('Connecting…');
    streams.forEach(function (url) {
      var es = new EventSource(url);
      open.push(es);
      kinds.forEach(function (k) { es.addEventListener(k, onEvent); });
      es.onmessage = onEvent;
      es.onopen = function () { say('Live'); body.dataset.live = 'on'; };
      es.onerror = function () { say('Reconnecting…'); };
    });
  }

  // Relative times, as the server writes them (`view::ago`), counted from the server's clock.
  var serverNow = Date.parse(body.dataset.now || '');
  var skew = isNaN(serverNow) ? 0 : serverNow - Date.now();
  function ago(ms) {
    var secs = Math.trunc((Date.now() + skew - ms) / 1000);
    var n = Math.abs(secs);
    var span = n < 60 ? n + ' s' : n < 3600 ? Math.floor(n / 60) + ' min' : n < 86400 ? Math.floor(n / 3600) + ' h' : Math.floor(n / 86400) + ' d';
    return secs < 0 ? 'in ' + span : span + ' ago';
  }
  function tick() {
    document.querySelectorAll('time[data-ago]').forEach(function (t) {
      var ms = Date.parse(t.getAttribute('datetime'));
      if (isNaN(ms)) return;
      var text = ago(ms);
      if (t.textContent !== text) t.textContent = text;
    });
  }
  setInterval(tick, 1000);

  // The transcript of a running crew step.
  var source = null, sourceUrl = '';
  function tail() {
    var box = document.getElementById('transcript');
    var url = box && box.dataset.stream;
    if (url === sourceUrl) return;
    if (source) { source.close(); source = null; }
    sourceUrl = url || '';
    if (!url || !window.EventSource) return;
    var list = document.getElementById('transcript-lines');
    var last = Number(box.dataset.last || 0);
    source = new EventSource(url);
    source.addEventListener('line', function (e) {
      var l;
      try { l = JSON.parse(e.data); } catch (err) { return; }
      if (l.seq <= last) return;
      last = l.seq;
      var list = document.getElementById('transcript-lines');
      if (!list || !l.text) return;
      var near = list.scrollTop + list.clientHeight >= list.scrollHeight - 30;
      var li = document.createElement('li');
      li.dataset.seq = String(l.seq);
      li.className = l.kind;
      var s = document.createElement('span');
      s.className = 'stream';
      s.textContent = l.stream.replace(/_/g, ' ');
      li.appendChild(s);
      li.appendChild(document.createTextNode(' ' + l.text));
      list.appendChild(li);
      var empty = document.getElementById('transcript-empty');
      if (empty) empty.remove();
      if (near) list.scrollTop = list.scrollHeight;
    });
    if (!list) return;
  }
  tail();
})();
