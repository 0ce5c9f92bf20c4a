//! Headless Chromium for the console's browser tests: chromedriver on a loopback port, a
//! fantoccini client, state waits, and the checks every page gets: one h1, every field
//! labelled, state never in colour alone (`accessibility`), and no text outside its box at a
//! laptop's and a phone's size, with a screenshot of each under `target/screenshots/` (`fits`).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`make test` installs them when missing).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const CHROMIUM: [&str; 2] = ["/usr/bin/chromium", "/usr/bin/chromium-browser"];
const CHROMEDRIVER: [&str; 2] = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"];

fn found(paths: &[&str]) -> Option<PathBuf> {
    paths.iter().map(PathBuf::from).find(|p| p.exists())
}

/// chromedriver on a free loopback port; killed when dropped.
pub(crate) struct Driver {
    child: Child,
    url: String,
    _profile: tempfile::TempDir,
    chromium: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn driver() -> Driver {
    let (Some(chromium), Some(chromedriver)) = (found(&CHROMIUM), found(&CHROMEDRIVER)) else {
        panic!(
            "the console's browser tests need Chromium and chromedriver, and they are not installed: \
             run `sudo apt-get install chromium chromium-driver` (Debian/Ubuntu), or `make test`, which installs \
             them with apt-get when it can"
        );
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port");
    let mut child = Command::new(&chromedriver)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    for _ in 0..100 {
        if http.get(format!("{url}/status")).send().await.is_ok_and(|r| r.status().is_success()) {
            return Driver { child, url, _profile: tempfile::tempdir().expect("a profile directory"), chromium };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("chromedriver did not answer on {url} within 10 s");
}

pub(crate) async fn browser(d: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": d.chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,1400",
                format!("--user-data-dir={}", d._profile.path().display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&d.url)
        .await
        .unwrap_or_else(|e| panic!("chromedriver could not start Chromium: {e}"))
}

/// Types into the element `css` finds, finding it afresh until it takes the keys: a live page
/// may swap the region it is in between the finding and the typing (a hang guard of 120 s).
pub(crate) async fn type_into(c: &Client, css: &str, text: &str) {
    retry(css, || async { c.find(Locator::Css(css)).await?.send_keys(text).await }).await;
}

/// Clicks the element `css` finds, finding it afresh until the click lands (see `type_into`).
pub(crate) async fn click_on(c: &Client, css: &str) {
    retry(css, || async { c.find(Locator::Css(css)).await?.click().await.map(|_| ()) }).await;
}

async fn retry<F, Fut>(css: &str, mut act: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), fantoccini::error::CmdError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        match act().await {
            Ok(()) => return,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("{css}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Runs a script until it returns true (a hang guard of 120 s).
pub(crate) async fn until(c: &Client, script: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let v = c.execute(script, vec![]).await.unwrap_or(Value::Null);
        if v == Value::Bool(true) {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let h1 = c.execute("return document.querySelector('h1') && document.querySelector('h1').textContent", vec![]).await.unwrap_or_default();
            panic!("never happened: {what} (h1: {h1})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the page's h1 says `words` (a hang guard of 120 s).
pub(crate) async fn until_h1(c: &Client, words: &str, what: &str) {
    until_text(c, "h1", words, what).await;
}

/// Waits until the element `css` finds says `words` (a hang guard of 120 s).
pub(crate) async fn until_text(c: &Client, css: &str, words: &str, what: &str) {
    let script = format!("return !!document.querySelector({css:?}) && document.querySelector({css:?}).textContent.includes({words:?})");
    until(c, &script, what).await;
}

/// Waits until the page has an element `css` finds (a hang guard of 120 s).
pub(crate) async fn until_found(c: &Client, css: &str, what: &str) {
    until(c, &format!("return !!document.querySelector({css:?})"), what).await;
}

/// Clicks the element `css` finds.
pub(crate) async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}")).click().await.unwrap();
}

/// Replaces the text of the field `css` finds with `text`.
pub(crate) async fn fill(c: &Client, css: &str, text: &str) {
    let field = c.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
    field.clear().await.unwrap();
    field.send_keys(text).await.unwrap();
}

/// The text of the element `css` finds.
pub(crate) async fn text(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}")).text().await.unwrap_or_default()
}

/// What `script` returns.
pub(crate) async fn script(c: &Client, script: &str) -> Value {
    c.execute(script, vec![]).await.unwrap_or_else(|e| panic!("{script}: {e}"))
}

pub(crate) async fn h1(c: &Client) -> String {
    c.find(Locator::Css("h1")).await.expect("an h1").text().await.unwrap_or_default()
}

/// One h1; every visible field labelled; every state badge and graph node says its state in
/// text. Returns the problems found.
pub(crate) async fn accessibility(c: &Client, page: &str) {
    let problems = c
        .execute(
            r#"
            const out = [];
            const h1s = document.querySelectorAll('h1').length;
            if (h1s !== 1) out.push(h1s + ' h1 elements');
            for (const el of document.querySelectorAll('input, select, textarea')) {
              if (el.type === 'hidden') continue;
              const labelled = (el.id && document.querySelector('label[for="' + el.id + '"]')) || el.closest('label') || el.getAttribute('aria-label');
              if (!labelled) out.push('unlabelled ' + el.tagName + ' ' + (el.name || ''));
            }
            for (const b of document.querySelectorAll('.badge, svg .node, svg .bar')) {
              if (!b.textContent.trim().match(/[a-z]/)) out.push('a state shown by colour alone: ' + b.outerHTML.slice(0, 80));
            }
            return out;
            "#,
            vec![],
        )
        .await
        .expect("the accessibility script runs");
    assert_eq!(problems, json!([]), "{page}: accessibility problems");
}

fn screenshots() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("screenshots");
    std::fs::create_dir_all(&dir).expect("target/screenshots");
    dir
}

pub(crate) async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    let path = screenshots().join(name);
    std::fs::write(&path, png).expect("write the screenshot");
    eprintln!("screenshot: {}", path.display());
}

/// The sizes every page is checked at: a laptop's and a phone's.
pub(crate) const VIEWPORTS: [(u32, u32); 2] = [(1280, 900), (390, 844)];

/// What of the page's text lies outside its box: text past the edge of the block that holds it
/// or cut off by an ancestor that hides overflow (a scrolling box is fine: the text is reached
/// by scrolling it), SVG text outside its picture, and a page wider than the window.
const OVERFLOWS: &str = r#"
const out = [];
const seen = (el) => { const s = getComputedStyle(el); return s.display !== 'none' && s.visibility !== 'hidden'; };
const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (el.className && typeof el.className === 'string' ? '.' + el.className.trim().replace(/\s+/g, '.') : '');
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
while (walker.nextNode()) {
  const t = walker.currentNode;
  const text = t.textContent.trim();
  if (!text) continue;
  let el = t.parentElement;
  if (!el || el.closest('svg, script, style, noscript, template, textarea, option')) continue;
  if (!seen(el) || el.closest('[hidden]')) continue;
  const range = document.createRange();
  range.selectNodeContents(t);
  const r = range.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) continue;
  // The box the text is laid out in: the nearest ancestor that is not inline.
  let box = el;
  while (box.parentElement && getComputedStyle(box).display === 'inline') box = box.parentElement;
  const b = box.getBoundingClientRect();
  if (r.right > b.right + 1 || r.left < b.left - 1) {
    out.push('"' + text.slice(0, 40) + '" runs past ' + name(box) + ' (' + Math.round(r.left) + '..' + Math.round(r.right) + ' in ' + Math.round(b.left) + '..' + Math.round(b.right) + ')');
    continue;
  }
  for (let a = box; a && a !== document.documentElement; a = a.parentElement) {
    const s = getComputedStyle(a);
    if (s.overflowX === 'auto' || s.overflowX === 'scroll') break;
    if ((s.overflowX === 'hidden' || s.overflowX === 'clip') && s.textOverflow !== 'ellipsis') {
      const ab = a.getBoundingClientRect();
      if (r.right > ab.right + 1 || r.left < ab.left - 1) { out.push('"' + text.slice(0, 40) + '" is cut off by ' + name(a)); break; }
    }
  }
}
for (const svg of document.querySelectorAll('svg')) {
  if (!seen(svg)) continue;
  const s = svg.getBoundingClientRect();
  for (const t of svg.querySelectorAll('text')) {
    const r = t.getBoundingClientRect();
    if (r.width === 0) continue;
    if (r.left < s.left - 1 || r.right > s.right + 1 || r.top < s.top - 1 || r.bottom > s.bottom + 1) {
      out.push('svg text "' + t.textContent.trim().slice(0, 40) + '" outside its picture ' + name(svg));
    }
  }
}
if (document.documentElement.scrollWidth > window.innerWidth + 1) {
  out.push('the page is ' + document.documentElement.scrollWidth + ' px wide in a ' + window.innerWidth + ' px window');
}
return out;
"#;

/// Checks the page at each of `VIEWPORTS`: no text outside its box; keeps a screenshot of each
/// as `target/screenshots/<name>-<width>.png`. Leaves the window at the laptop's size.
pub(crate) async fn fits(c: &Client, name: &str) {
    let mut problems = Vec::new();
    for viewport in VIEWPORTS {
        problems.extend(overflows_at(c, name, viewport).await);
    }
    resize(c, VIEWPORTS[0]).await;
    assert!(problems.is_empty(), "{name}: text outside its box:\n{}", problems.join("\n"));
}

/// `fits` at the window's size as it is (`resize` first): for a test that visits many pages
/// at one size, then at the other.
pub(crate) async fn fits_here(c: &Client, name: &str) {
    let size = c.get_window_rect().await.expect("the window's size");
    let problems = overflows_at(c, name, (size.2 as u32, size.3 as u32)).await;
    assert!(problems.is_empty(), "{name}: text outside its box:\n{}", problems.join("\n"));
}

pub(crate) async fn resize(c: &Client, (w, h): (u32, u32)) {
    c.set_window_size(w, h).await.expect("the window resizes");
    until(c, &format!("return window.innerWidth === {w}"), &format!("a window {w} px wide")).await;
}

async fn overflows_at(c: &Client, name: &str, (w, h): (u32, u32)) -> Vec<String> {
    if c.execute("return window.innerWidth", vec![]).await.ok() != Some(json!(w)) {
        resize(c, (w, h)).await;
    }
    screenshot(c, &format!("{name}-{w}.png")).await;
    let found = c.execute(OVERFLOWS, vec![]).await.expect("the overflow script runs");
    found.as_array().into_iter().flatten().map(|p| format!("{w}×{h}: {}", p.as_str().unwrap_or_default())).collect()
}
