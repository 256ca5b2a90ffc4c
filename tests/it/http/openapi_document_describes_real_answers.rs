//! `GET /v1/openapi.json` as a client generator reads it: every route the daemon serves is
//! in the document, and the real answers of a running daemon (a scoped board, a
//! dense_rank board, a calendar-period board, a board with a change feed; successes and
//! errors) validate against the schemas the document gives for their route, method and
//! status (answers that are not JSON, the metrics, the page and the change feed's event
//! stream, against the media types it gives).

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::support::boards::redis_now;
use crate::support::config::{server_and_config, write_config, write_file};
use crate::support::daemon::Daemon;
use crate::support::http::json;
use crate::support::wait::drained;

const READER_TOKEN: &str = "openapi-reader-token-5c1d";

/// Besides the test boards: a dense_rank board, a weekly board, a board with a change feed
/// and a board with two windows, all ranking `user`.
const EXTRA_BOARDS: &str = concat!(
    "\n[[boards]]\nname = \"dense_7d\"\nmember = \"user\"\nwindow = \"7d\"\nslice = \"1h\"\ndense_rank = true\n",
    "\n[[boards]]\nname = \"weekly\"\nmember = \"user\"\nperiod = \"week\"\ntime_zone = \"Europe/Berlin\"\nperiod_grace = \"1h\"\n",
    "\n[[boards]]\nname = \"live_7d\"\nmember = \"user\"\nwindow = \"7d\"\nslice = \"1h\"\nchanges_top = 10\n",
    "\n[[boards]]\nname = \"multi\"\nmember = \"user\"\nwindows = [\"1h\", \"7d\"]\nslice = \"1h\"\n",
);

/// One request to the daemon: its route template (as in the document), and the answer.
struct Exchange {
    method: &'static str,
    template: &'static str,
    path: String,
    status: u16,
    content_type: String,
    body: String,
}

struct Client {
    base: String,
    http: reqwest::Client,
    seen: Vec<Exchange>,
}

impl Client {
    /// `method path` (with `body` as JSON when given), with the reader's token unless
    /// `token` is false; the answer is kept for validation.
    async fn send(
        &mut self,
        method: &'static str,
        template: &'static str,
        path: &str,
        body: Option<&str>,
        token: bool,
    ) -> (u16, String) {
        let url = format!("{}{path}", self.base);
        let mut request = match method {
            "get" => self.http.get(url),
            _ => self.http.post(url),
        };
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        if token {
            request = request.bearer_auth(READER_TOKEN);
        }
        let answer = request.send().await.expect("request");
        let status = answer.status().as_u16();
        let content_type = content_type(&answer);
        let body = answer.text().await.expect("body");
        self.seen.push(Exchange {
            method,
            template,
            path: path.to_string(),
            status,
            content_type,
            body: body.clone(),
        });
        (status, body)
    }

    /// GETs `path` (an event stream) with the reader's token and keeps its status and
    /// media type, without reading the body (a stream does not end).
    async fn head(&mut self, template: &'static str, path: &str) -> u16 {
        let answer = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(READER_TOKEN)
            .send()
            .await
            .expect("request");
        let status = answer.status().as_u16();
        let content_type = content_type(&answer);
        self.seen.push(Exchange {
            method: "get",
            template,
            path: path.to_string(),
            status,
            content_type,
            body: String::new(),
        });
        status
    }

    async fn get(&mut self, template: &'static str, path: &str) -> (u16, String) {
        self.send("get", template, path, None, true).await
    }

    /// GETs each `(template, path)` with the reader's token; every answer must be `status`.
    async fn get_each(&mut self, cases: &[(&'static str, &str)], status: u16) {
        for &(template, path) in cases {
            let (got, body) = self.get(template, path).await;
            assert_eq!(got, status, "{path}: {body}");
        }
    }

    async fn post(&mut self, template: &'static str, path: &str, body: &str) -> (u16, String) {
        self.send("post", template, path, Some(body), true).await
    }
}

/// An answer's `Content-Type`, empty when it has none.
fn content_type(answer: &reqwest::Response) -> String {
    answer
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// The path of the document that describes a request to `path` of route `template`: the
/// board's own path for a board's route (`/v1/boards/rooms_7d/top`); `None` for a board
/// the daemon does not have, which the document does not describe.
fn documented_path(doc: &Value, template: &str, path: &str) -> Option<String> {
    if !template.contains("{board}") {
        return Some(template.to_string());
    }
    let path = path.split('?').next().unwrap_or_default();
    let board = path.split('/').nth(3)?;
    let documented = template.replace("{board}", board);
    doc["paths"].get(&documented).map(|_| documented)
}

/// A board's path of the document as the route it is (`/v1/boards/{board}/top`).
fn route_of(path: &str) -> String {
    let mut parts: Vec<&str> = path.split('/').collect();
    if parts.len() > 3 && parts[1] == "v1" && parts[2] == "boards" {
        parts[3] = "{board}";
    }
    parts.join("/")
}

/// The schema the document gives for the answer of `method template` with `status`, as a
/// schema of its own (the document's components beside it, for its `$ref`s).
fn response_schema(doc: &Value, method: &str, template: &str, status: u16) -> Value {
    let response = &doc["paths"][template][method]["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{method} {template}: status {status} is not in the document"
    );
    let schema = &response["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {template} {status}: no JSON schema in {response}"
    );
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "allOf": [schema],
        "components": doc["components"],
    })
}

/// Validates every kept answer against its schema in the document; every failure named.
fn assert_answers_valid(doc: &Value, seen: &[Exchange]) {
    let mut failures = Vec::new();
    for exchange in seen {
        let (method, status) = (exchange.method, exchange.status);
        let Some(template) = documented_path(doc, exchange.template, &exchange.path) else {
            continue;
        };
        let template = template.as_str();
        if !exchange.content_type.starts_with("application/json") {
            let media = &doc["paths"][template][method]["responses"][status.to_string()]["content"];
            let documented = media
                .as_object()
                .map(|m| {
                    m.keys()
                        .any(|k| exchange.content_type.starts_with(k.as_str()))
                })
                .unwrap_or(false);
            if !documented {
                failures.push(format!(
                    "{method} {template} {status}: {} is not documented ({media})",
                    exchange.content_type
                ));
            }
            continue;
        }
        let schema = response_schema(doc, method, template, status);
        let validator = jsonschema::draft202012::new(&schema)
            .unwrap_or_else(|e| panic!("{method} {template} {status}: schema: {e}"));
        let body: Value = json(&exchange.body);
        let errors: Vec<String> = validator
            .iter_errors(&body)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if !errors.is_empty() {
            failures.push(format!(
                "{method} {template} {status}: {}\n  body: {}",
                errors.join("; "),
                exchange.body
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The document's routes as `(method, path)`.
fn documented_routes(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("path item")
                .keys()
                .filter(|k| ["get", "post", "put", "patch", "delete"].contains(&k.as_str()))
                .map(move |method| (method.clone(), route_of(path)))
        })
        .collect()
}

/// The route templates the daemon reports in `rollboard_http_requests_total` as having
/// answered (its router's own templates, never raw paths).
async fn answered_routes(client: &Client) -> BTreeSet<String> {
    let text = client
        .http
        .get(format!("{}/metrics", client.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    // Read by hand: a template's braces are not for prometheus_parse.
    text.lines()
        .filter_map(|line| line.strip_prefix("rollboard_http_requests_total{"))
        .filter(|line| line.rsplit(' ').next().is_some_and(|v| v != "0"))
        .filter_map(|line| {
            let route = line.split_once("route=\"")?.1;
            Some(route.split_once('"')?.0.to_string())
        })
        .filter(|route| route != "unmatched")
        .collect()
}

#[tokio::test]
async fn real_answers_validate_against_the_served_openapi_document() {
    let (redis, _dir, port, config) = server_and_config(|dir, redis, port| {
        let token_file = write_file(dir, "reader.token", READER_TOKEN);
        let extra = format!(
            "query_token_file = \"{}\"\n{EXTRA_BOARDS}",
            token_file.display()
        );
        write_config(dir, redis, port, "oa", &extra)
    });
    let store = redis.store("rb").await;
    let daemon = Daemon::start(&config, port).await;
    let mut client = Client {
        base: daemon.base.clone(),
        http: reqwest::Client::new(),
        seen: Vec::new(),
    };

    // Without the reader's token: 401, the document included.
    let (status, _) = client
        .send("get", "/v1/openapi.json", "/v1/openapi.json", None, false)
        .await;
    assert_eq!(status, 401);
    let (status, _) = client
        .send(
            "get",
            "/v1/boards/{board}/top",
            "/v1/boards/rooms_7d/top",
            None,
            false,
        )
        .await;
    assert_eq!(status, 401);
    let (status, text) = client.get("/v1/openapi.json", "/v1/openapi.json").await;
    assert_eq!(status, 200, "{text}");
    let doc = json(&text);
    assert_eq!(doc["openapi"], "3.1.0");
    let (status, _) = client.get("/v1/openapi.json", "/v1/openapi.json?x=1").await;
    assert_eq!(status, 400);

    // Tips: u1 and u2 tie on the dense board, u3 below; all in this week.
    let now = redis_now(&store).await;
    let intake = "/v1/events";
    let one = format!(r#"{{"id":"oa1","ts":{now},"room":"r1","user":"u1","amount":"5"}}"#);
    let (status, body) = client.post(intake, intake, &one).await;
    assert_eq!(status, 202, "{body}");
    let many = format!(
        r#"[{{"id":"oa2","ts":{now},"room":"r1","user":"u2","amount":"5"}},
            {{"id":"oa3","ts":{now},"room":"r2","user":"u3","amount":2}}]"#
    );
    let (status, body) = client.post(intake, intake, &many).await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = client.post(intake, intake, r#"[{"room":"r1"}]"#).await;
    assert_eq!(status, 400, "{body}");
    assert!(json(&body)["invalid"].is_array(), "{body}");
    let (status, body) = client.post(intake, intake, "not json").await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = client.send("post", intake, intake, None, true).await;
    assert_eq!(status, 415);
    assert!(drained(&store).await, "the tips were not applied");

    // The boards.
    let board = "/v1/boards/{board}";
    for path in [
        "/v1/boards/rooms_7d",
        "/v1/boards/weekly",
        "/v1/boards/dense_7d",
        "/v1/boards/multi",
    ] {
        let (status, body) = client.get(board, path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (_, body) = client.get(board, "/v1/boards/weekly").await;
    assert!(json(&body)["period_id"].is_string(), "{body}");
    let (_, body) = client.get(board, "/v1/boards/multi").await;
    assert_eq!(json(&body)["windows"][1]["name"], "7d", "{body}");
    let (status, body) = client.get("/v1/boards", "/v1/boards").await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = client.get(board, "/v1/boards/nope").await;
    assert_eq!(status, 404);

    // Pages.
    let top = "/v1/boards/{board}/top";
    for (path, expected) in [
        ("/v1/boards/rooms_7d/top", 200),
        ("/v1/boards/fans_7d/top?scope=r1&limit=5", 200),
        ("/v1/boards/dense_7d/top", 200),
        ("/v1/boards/weekly/top", 200),
        ("/v1/boards/weekly/top?period=previous", 200),
        ("/v1/boards/tips_24h/top?offset=100", 200),
        ("/v1/boards/multi/top?window=7d", 200),
        ("/v1/boards/multi/top?window=2d", 400),
        ("/v1/boards/rooms_7d/top?limit=0", 400),
        ("/v1/boards/rooms_7d/top?limt=5", 400),
        ("/v1/boards/fans_7d/top", 400),
        ("/v1/boards/weekly/top?period=yesterday", 400),
    ] {
        let (status, body) = client.get(top, path).await;
        assert_eq!(status, expected, "{path}: {body}");
    }
    let (_, body) = client.get(top, "/v1/boards/dense_7d/top").await;
    assert_eq!(json(&body)["entries"][1]["dense_rank"], 1, "{body}");
    let (status, _) = client.get(top, "/v1/boards/nope/top").await;
    assert_eq!(status, 404);

    // One member, and the entries around it.
    let member = "/v1/boards/{board}/members/{member}";
    let around = "/v1/boards/{board}/members/{member}/around";
    let found = [
        (member, "/v1/boards/rooms_7d/members/r1"),
        (member, "/v1/boards/dense_7d/members/u2"),
        (member, "/v1/boards/weekly/members/u3"),
        (around, "/v1/boards/dense_7d/members/u1/around?radius=1"),
        (around, "/v1/boards/weekly/members/u1/around"),
        (around, "/v1/boards/rooms_7d/members/r2/around"),
        (around, "/v1/boards/multi/members/u1/around?window=7d"),
        (member, "/v1/boards/multi/members/u1?window=1h"),
        (member, "/v1/boards/multi/members/u1?all_windows=true"),
        (member, "/v1/boards/multi/members/nobody?all_windows=true"),
        (member, "/v1/boards/weekly/members/u3?all_windows=true"),
        (member, "/v1/boards/rooms_7d/members/r1?all_windows=true"),
    ];
    client.get_each(&found, 200).await;
    let (_, body) = client
        .get(member, "/v1/boards/weekly/members/u3?all_windows=true")
        .await;
    let weekly = json(&body);
    assert_eq!(weekly["windows"][0]["window"], "week", "{body}");
    assert!(weekly["period"].is_string(), "{body}");
    let unknown = [
        (member, "/v1/boards/rooms_7d/members/nobody"),
        (member, "/v1/boards/dense_7d/members/nobody"),
        (member, "/v1/boards/weekly/members/nobody"),
        (member, "/v1/boards/fans_7d/members/nobody?scope=r1"),
        (around, "/v1/boards/dense_7d/members/nobody/around"),
        (around, "/v1/boards/weekly/members/nobody/around"),
        (member, "/v1/boards/nope/members/u1"),
        (around, "/v1/boards/nope/members/u1/around"),
    ];
    client.get_each(&unknown, 404).await;
    let (_, body) = client
        .get(member, "/v1/boards/dense_7d/members/nobody")
        .await;
    let mut missing = json(&body);
    assert!(
        missing["error"].is_string() && missing["dense_rank"].is_null(),
        "{body}"
    );
    let refused = [
        (member, "/v1/boards/rooms_7d/members/r1?radius=1"),
        (around, "/v1/boards/rooms_7d/members/r1/around?radius=101"),
        (
            member,
            "/v1/boards/multi/members/u1?all_windows=true&window=5h",
        ),
        (member, "/v1/boards/multi/members/u1?window=2h"),
    ];
    client.get_each(&refused, 400).await;

    // A list of members re-ranked.
    let ranks = "/v1/boards/{board}/ranks";
    for (path, body) in [
        (
            "/v1/boards/dense_7d/ranks",
            r#"{"members":["u3","ghost","u1"]}"#,
        ),
        (
            "/v1/boards/weekly/ranks",
            r#"{"members":["u1"],"window":"week"}"#,
        ),
        (
            "/v1/boards/fans_7d/ranks",
            r#"{"members":["u1"],"scope":"r1"}"#,
        ),
        (
            "/v1/boards/rooms_7d/ranks",
            r#"{"members":["r1"],"window":"7d"}"#,
        ),
        (
            "/v1/boards/multi/ranks",
            r#"{"members":["u1"],"window":"7d"}"#,
        ),
    ] {
        let (status, answer) = client.post(ranks, path, body).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    for body in [r#"{"members":[]}"#, r#"{"members":["a"],"extra":1}"#, "[]"] {
        let (status, answer) = client.post(ranks, "/v1/boards/rooms_7d/ranks", body).await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
    let (status, _) = client
        .post(ranks, "/v1/boards/nope/ranks", r#"{"members":["a"]}"#)
        .await;
    assert_eq!(status, 404);

    // The change feed: a stream, and its refusals.
    let changes = "/v1/boards/{board}/changes";
    let status = client
        .head(changes, "/v1/boards/live_7d/changes?window=7d")
        .await;
    assert_eq!(status, 200);
    for (path, want) in [
        ("/v1/boards/live_7d/changes?window=1h", 400),
        ("/v1/boards/rooms_7d/changes", 404),
        ("/v1/boards/nope/changes", 404),
    ] {
        let (status, body) = client.get(changes, path).await;
        assert_eq!(status, want, "{path}: {body}");
    }
    let (status, _) = client
        .send("get", changes, "/v1/boards/live_7d/changes", None, false)
        .await;
    assert_eq!(status, 401);

    // The page.
    let (status, body) = client.send("get", "/", "/", None, false).await;
    assert_eq!(status, 200);
    assert!(body.contains("<title>rollboard</title>"), "{body}");

    // What monitoring reads.
    for (template, path, want) in [
        ("/healthz", "/healthz", 200),
        ("/healthz", "/healthz?verbose=1", 400),
        ("/metrics", "/metrics", 200),
        ("/metrics", "/metrics?x", 400),
    ] {
        let (status, body) = client.get(template, path).await;
        assert_eq!(status, want, "{path}: {body}");
    }
    assert!(
        daemon
            .readyz_becomes(200, std::time::Duration::from_secs(20))
            .await
    );
    let (status, body) = client.get("/readyz", "/readyz").await;
    assert_eq!(status, 200, "{body}");

    assert_answers_valid(&doc, &client.seen);
    // And the schemas do refuse: a page without its entries, a member not on the board
    // without its error.
    let (_, page) = client.get(top, "/v1/boards/dense_7d/top").await;
    let mut page = json(&page);
    page.as_object_mut().map(|p| p.remove("entries"));
    let dense_top = documented_path(&doc, top, "/v1/boards/dense_7d/top").expect("dense top");
    let schema = response_schema(&doc, "get", &dense_top, 200);
    assert!(!jsonschema::is_valid(&schema, &page), "{page}");
    missing.as_object_mut().map(|m| m.remove("error"));
    let dense_member =
        documented_path(&doc, member, "/v1/boards/dense_7d/members/x").expect("member");
    let schema = response_schema(&doc, "get", &dense_member, 404);
    assert!(!jsonschema::is_valid(&schema, &missing), "{missing}");

    // Every route the router answered (its own templates, from its metrics) is in the
    // document, and every documented route was answered here.
    let answered = answered_routes(&client).await;
    let documented = documented_routes(&doc);
    let documented_paths: BTreeSet<String> = documented.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(answered, documented_paths, "routes answered vs documented");
    let exercised: BTreeSet<(String, String)> = client
        .seen
        .iter()
        .map(|e| (e.method.to_string(), e.template.to_string()))
        .collect();
    assert_eq!(
        exercised, documented,
        "(method, route) exercised vs documented"
    );
    let registered: BTreeSet<String> = rollboard::metrics::HTTP_ROUTES
        .iter()
        .map(|r| r.to_string())
        .collect();
    assert_eq!(
        registered, documented_paths,
        "the metrics' routes vs documented"
    );

    // For the spec validator CI runs on it (scripts/check-openapi).
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&target).expect("target dir");
    std::fs::write(target.join("openapi.json"), &text).expect("write target/openapi.json");
}
