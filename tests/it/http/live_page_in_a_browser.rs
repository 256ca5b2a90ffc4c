//! `GET /` in a real browser: Debian's headless Chromium (driven over the DevTools protocol)
//! loads the page from a daemon whose queries need the reader's token (given in the URL
//! fragment), a tip is posted, and the member shows in the page's table with its arrow;
//! on a board with several windows the page offers a window picker, on the window the
//! fragment names. The screenshot is saved to `target/artifacts/page.png` (and to `docs/page.png` with
//! `ROLLBOARD_UPDATE_DOCS=1`). Chromium comes from `scripts/ensure-chromium`.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions};

use crate::support::boards::redis_now;
use crate::support::config::{
    append_config, board_table, server_and_config, write_config, write_file,
};
use crate::support::daemon::Daemon;
use crate::support::http::{get, post_tip};
use crate::support::keys::schema;
use crate::support::sse::{entered, feed_boards};
use crate::support::wait::drained;

const TOKEN: &str = "page-reader-token-3e9a";

/// Chromium's binary: Debian's `chromium` (see scripts/ensure-chromium).
fn chromium() -> PathBuf {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no chromium: run scripts/ensure-chromium"))
}

/// Where the test's artifacts go (`target/artifacts`).
fn artifacts() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("artifacts")
}

/// What the browser thread tells the test.
enum Seen {
    /// The page is loaded and shows the board.
    Loaded,
    /// The member shows, with its arrow; the screenshot; then what the window picker
    /// shows on a board with several windows.
    Shown {
        arrow: String,
        png: Vec<u8>,
        feed_events: String,
        picker: String,
    },
    /// Something failed, with the page's text.
    Failed(String),
}

/// Loads `url`, waits for the first tip's member, reports, waits for `go`, then waits for
/// `member` in the table and takes the screenshot; then loads the page again with the
/// fragment `windows` (a board with several windows, one of them named) and reads its
/// window picker.
fn browse(
    (url, windows): (String, String),
    member: &'static str,
    seen: mpsc::Sender<Seen>,
    go: mpsc::Receiver<()>,
) {
    let run = || -> anyhow::Result<Seen> {
        let options = LaunchOptions::default_builder()
            .path(Some(chromium()))
            .sandbox(false)
            .window_size(Some((900, 560)))
            .idle_browser_timeout(Duration::from_secs(120))
            .build()?;
        let browser = Browser::new(options)?;
        let tab = browser.new_tab()?;
        tab.navigate_to(&url)?;
        let shown = tab.wait_for_element_with_custom_timeout(
            "tr[data-member='room-a']",
            Duration::from_secs(20),
        );
        if let Err(e) = shown {
            let text = tab
                .evaluate("document.body.innerText", false)
                .ok()
                .and_then(|o| o.value)
                .map(|v| v.to_string())
                .unwrap_or_default();
            anyhow::bail!("{e:#}; the page shows: {text}");
        }
        let _ = seen.send(Seen::Loaded);
        go.recv_timeout(Duration::from_secs(60))?;
        let selector = format!("tr[data-member='{member}'] td.move");
        let cell = tab.wait_for_element_with_custom_timeout(&selector, Duration::from_secs(30))?;
        let arrow = cell.get_inner_text()?;
        // The row's highlight fades out: let it, for a still picture.
        std::thread::sleep(Duration::from_millis(1600));
        let feed_events = tab
            .evaluate("document.body.dataset.feedEvents || '0'", false)?
            .value
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .unwrap_or_default();
        let png = tab.capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)?;
        // The picker lists the board's windows, picks the one named, and `top` reads it.
        tab.evaluate(
            &format!("location.hash = {windows:?}; location.reload(); true"),
            false,
        )?;
        tab.wait_for_element_with_custom_timeout(
            "#window option[value='6h']",
            Duration::from_secs(20),
        )?;
        let read = "[document.getElementById('window-pick').style.display,                     document.getElementById('window').value,                     [...document.getElementById('window').options].map((o) => o.value).join(','),                     document.getElementById('status').textContent].join('|')";
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let picker = loop {
            let shown = tab
                .evaluate(read, false)?
                .value
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            if shown.contains("ranked in") || std::time::Instant::now() > deadline {
                break shown;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        Ok(Seen::Shown {
            arrow,
            png,
            feed_events,
            picker,
        })
    };
    let _ = seen.send(run().unwrap_or_else(|e| Seen::Failed(format!("{e:#}"))));
}

#[tokio::test]
async fn the_page_shows_a_new_tip_live_with_the_readers_token() {
    let (redis, _dir, port, config) = server_and_config(|dir, redis, port| {
        let token = write_file(dir, "reader.token", TOKEN);
        let extra = format!("query_token_file = \"{}\"\n", token.display());
        write_config(dir, redis, port, "page", &extra)
    });
    feed_boards(&config);
    append_config(
        &config,
        &board_table("duo", "player", r#"["2h", "6h"]"#, ""),
    );
    let store = redis.store("rb").await;
    let daemon = Daemon::start(&config, port).await;
    let now = redis_now(&store).await;
    for (id, room, amount) in [("p1", "room-a", "30"), ("p2", "room-b", "20")] {
        let (status, _, body) = post_tip(&daemon, id, now, room, "u1", amount).await;
        assert_eq!(status, 202, "{body}");
    }
    assert!(drained(&store).await, "the tips were not applied");
    let (status, _, _) = get(&daemon, "/v1/boards").await;
    assert_eq!(status, 401, "the queries need the token");

    let url = format!("{}/#token={TOKEN}&board=rooms_7d", daemon.base);
    let windows = "board=duo&window=6h".to_string();
    let (seen_tx, seen) = mpsc::channel();
    let (go, go_rx) = mpsc::channel();
    let browser =
        tokio::task::spawn_blocking(move || browse((url, windows), "room-live", seen_tx, go_rx));
    let next = || {
        seen.recv_timeout(Duration::from_secs(90))
            .unwrap_or_else(|e| panic!("the browser said nothing: {e}"))
    };
    match next() {
        Seen::Loaded => {}
        Seen::Failed(why) => panic!("the page did not load: {why}\n{}", daemon.logs()),
        Seen::Shown { .. } => unreachable!("shown before the tip"),
    }

    let (status, _, body) = post_tip(&daemon, "p3", now, "room-live", "u2", "45").await;
    assert_eq!(status, 202, "{body}");
    assert!(drained(&store).await, "the tip was not applied");
    // The change it makes, as the feed records it.
    entered(
        &store,
        &schema().changes("rooms_7d", None, None),
        "room-live",
        1,
        45,
    )
    .await;
    go.send(()).expect("the browser thread");
    let (arrow, png, feed_events, picker) = match next() {
        Seen::Shown {
            arrow,
            png,
            feed_events,
            picker,
        } => (arrow, png, feed_events, picker),
        Seen::Failed(why) => panic!("the tip never showed: {why}"),
        Seen::Loaded => unreachable!("loaded twice"),
    };
    browser.await.expect("the browser thread");
    assert_eq!(arrow.trim(), "new", "a member new to the top is marked new");
    // The change feed reached the page (its events, not only its timer, read `top`).
    let feed_events: u64 = feed_events.parse().expect("a count");
    assert!(feed_events >= 1, "the page received no feed event");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    // Shown, holding the board's windows in order, on the one the fragment named; the
    // status names the window read.
    let parts: Vec<&str> = picker.splitn(4, '|').collect();
    assert_eq!(&parts[..3], &["", "6h", "2h,6h"], "{picker}");
    assert!(parts[3].contains("duo: 0 ranked in 6h"), "{picker}");

    let dir = artifacts();
    std::fs::create_dir_all(&dir).expect("target/artifacts");
    std::fs::write(dir.join("page.png"), &png).expect("write the screenshot");
    if std::env::var_os("ROLLBOARD_UPDATE_DOCS").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/page.png");
        std::fs::write(docs, &png).expect("write docs/page.png");
    }
}
