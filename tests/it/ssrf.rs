//! SSRF battery (SPEC §11 `web_fetch`, reliability notes §2.4/§3.9): every payload is refused,
//! and a canary listener on 127.0.0.1 — the port every loopback payload points at — never
//! receives a connection. Private and link-local payloads must be refused by the guard before
//! any connect (asserted through the error kind); nothing here sends traffic off loopback.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use agentd::net::ssrf::{self, Guard, SsrfError};
use agentd::tools::web::WebFetchTool;
use agentd::tools::{SessionStatus, StatusSource, Tool, ToolContext, ToolError};
use futures::future::BoxFuture;
use reqwest::Url;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A std listener on 127.0.0.1 counting the connections it accepts, on its own thread.
struct Canary {
    port: u16,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Canary {
    fn start() -> Canary {
        let listener = StdListener::bind("127.0.0.1:0").expect("bind canary");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok(_) => {
                        h.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Canary {
            port,
            hits,
            stop,
            thread: Some(thread),
        }
    }

    /// Stop the thread (after one more accept round) and return the count.
    fn finish(mut self) -> usize {
        std::thread::sleep(Duration::from_millis(50));
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("canary thread");
        }
        self.hits.load(Ordering::SeqCst)
    }
}

/// A minimal HTTP/1.1 server on 127.0.0.1: path → (status, extra headers, body).
type Routes = HashMap<String, (u16, Vec<(String, String)>, String)>;

async fn serve(routes: Routes) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind server");
    let addr = listener.local_addr().expect("addr");
    let routes = Arc::new(routes);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let routes = routes.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf);
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, headers, body) =
                    routes
                        .get(&path)
                        .cloned()
                        .unwrap_or((404, vec![], "not found".into()));
                let mut resp = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                    body.len()
                );
                for (k, v) in headers {
                    resp.push_str(&format!("{k}: {v}\r\n"));
                }
                resp.push_str("\r\n");
                resp.push_str(&body);
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    addr
}

fn redirect(code: u16, to: &str) -> (u16, Vec<(String, String)>, String) {
    (code, vec![("Location".into(), to.into())], String::new())
}

fn html(body: &str) -> (u16, Vec<(String, String)>, String) {
    (
        200,
        vec![("Content-Type".into(), "text/html; charset=utf-8".into())],
        body.into(),
    )
}

/// Errors the guard returns before opening any connection.
fn refused_before_connect(e: &SsrfError) -> bool {
    matches!(
        e,
        SsrfError::Blocked { .. }
            | SsrfError::LocalName(_)
            | SsrfError::Scheme(_)
            | SsrfError::Userinfo
            | SsrfError::NoHost
            | SsrfError::InvalidUrl(_)
    )
}

struct NoStatus;
impl StatusSource for NoStatus {
    fn session_status(&self) -> BoxFuture<'_, Result<SessionStatus, String>> {
        Box::pin(async { Err("none".to_string()) })
    }
}

fn ctx() -> ToolContext {
    ToolContext {
        session_id: "s".into(),
        session_key: "k".into(),
        workspace: std::env::temp_dir(),
        allowed_paths: vec![],
        protected: Default::default(),
        reply_to: None,
        status: Arc::new(NoStatus),
        sees_images: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssrf_battery_is_refused_and_the_canary_sees_nothing() {
    let canary = Canary::start();
    let c = canary.port;
    let canary_url = format!("http://127.0.0.1:{c}/");
    let mut routes = Routes::new();
    for code in [301u16, 302, 303, 307, 308] {
        routes.insert(format!("/r{code}"), redirect(code, &canary_url));
    }
    routes.insert(
        "/meta".into(),
        redirect(302, "http://169.254.169.254/latest/meta-data/"),
    );
    routes.insert(
        "/mapped".into(),
        redirect(302, &format!("http://[::ffff:127.0.0.1]:{c}/")),
    );
    routes.insert(
        "/decimal".into(),
        redirect(302, &format!("http://2130706433:{c}/")),
    );
    routes.insert(
        "/local".into(),
        redirect(302, &format!("http://localhost:{c}/")),
    );
    routes.insert("/file".into(), redirect(302, "file:///etc/passwd"));
    // Two hops on the allowed host, then off to the canary.
    routes.insert("/hop".into(), redirect(302, "/r307"));
    let server = serve(routes).await;
    let s = server.port();
    // Only the redirect server (host AND port) is exempt; the canary port on the same host is not.
    let guard = Guard::new(vec![format!("127.0.0.1:{s}")]);

    let payloads: Vec<String> = vec![
        // Loopback, in several encodings, all at the canary.
        format!("http://127.0.0.1:{c}/"),
        format!("http://127.1:{c}/"),
        format!("http://2130706433:{c}/"),
        format!("http://0x7f000001:{c}/"),
        format!("http://0x7f.1:{c}/"),
        format!("http://017700000001:{c}/"),
        format!("http://0177.0.0.1:{c}/"),
        format!("http://[::1]:{c}/"),
        format!("http://[::ffff:127.0.0.1]:{c}/"),
        format!("http://[0:0:0:0:0:ffff:7f00:1]:{c}/"),
        format!("http://[::127.0.0.1]:{c}/"),
        format!("http://[64:ff9b::7f00:1]:{c}/"),
        format!("http://[2002:7f00:1::1]:{c}/"),
        format!("http://localhost:{c}/"),
        format!("http://localhost.:{c}/"),
        format!("http://LocalHost:{c}/"),
        format!("http://canary.localhost:{c}/"),
        format!("http://0.0.0.0:{c}/"),
        format!("http://0:{c}/"),
        format!("http://[::]:{c}/"),
        // Userinfo tricks.
        format!("http://evil.com@127.0.0.1:{c}/"),
        format!("http://evil.com:80@127.0.0.1:{c}/"),
        format!("http://127.0.0.1:{c}@evil.com/"),
        // Metadata and link-local.
        "http://169.254.169.254/latest/meta-data/".into(),
        "http://169.254.169.254.:80/".into(),
        "http://[fe80::1]/".into(),
        "http://[fd00:ec2::254]/".into(),
        "http://metadata.google.internal/".into(),
        // Private and shared address space.
        "http://10.0.0.1/".into(),
        "http://172.16.0.1/".into(),
        "http://192.168.1.1/".into(),
        "http://100.64.0.1/".into(),
        "http://198.18.0.1/".into(),
        "http://[fc00::1]/".into(),
        "http://224.0.0.1/".into(),
        // Schemes.
        "file:///etc/passwd".into(),
        format!("gopher://127.0.0.1:{c}/_GET"),
        format!("ftp://127.0.0.1:{c}/"),
        "data:text/plain,hello".into(),
        // Redirects from the allowed host to the canary and other internal targets.
        format!("http://127.0.0.1:{s}/r301"),
        format!("http://127.0.0.1:{s}/r302"),
        format!("http://127.0.0.1:{s}/r303"),
        format!("http://127.0.0.1:{s}/r307"),
        format!("http://127.0.0.1:{s}/r308"),
        format!("http://127.0.0.1:{s}/hop"),
        format!("http://127.0.0.1:{s}/meta"),
        format!("http://127.0.0.1:{s}/mapped"),
        format!("http://127.0.0.1:{s}/decimal"),
        format!("http://127.0.0.1:{s}/local"),
        format!("http://127.0.0.1:{s}/file"),
    ];
    assert!(payloads.len() >= 20);

    for payload in &payloads {
        let url = match Url::parse(payload) {
            Ok(url) => url,
            Err(e) => panic!("payload {payload} should parse (the guard must see it): {e}"),
        };
        let result = ssrf::fetch(&guard, &url, 1 << 20, Duration::from_secs(10)).await;
        match result {
            Ok(f) => panic!("payload {payload} was fetched: status {}", f.status),
            Err(e) => assert!(
                refused_before_connect(&e),
                "payload {payload} must be refused by the guard, got {e:?}"
            ),
        }
    }

    // The same through the tool: refused, as errors the model reads.
    let tool = WebFetchTool::new(1 << 20, vec![format!("127.0.0.1:{s}")]);
    let ctx = ctx();
    for payload in &payloads {
        let err = tool
            .call(json!({"url": payload}), &ctx)
            .await
            .expect_err(payload);
        assert!(
            matches!(err, ToolError::Denied(_) | ToolError::Invalid(_)),
            "{payload}: {err:?}"
        );
    }

    assert_eq!(canary.finish(), 0, "the canary received a connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_and_link_local_are_refused_before_connecting() {
    // No server anywhere: a refusal that came from a connect attempt would be `Http`/`Timeout`.
    let guard = Guard::default();
    for payload in [
        "http://10.0.0.1/",
        "http://172.16.0.1/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://169.254.169.254/",
        "http://[fe80::1]/",
    ] {
        let url = Url::parse(payload).expect("parse");
        let err = guard.resolve(&url).await.expect_err(payload);
        assert!(
            matches!(err, SsrfError::Blocked { .. }),
            "{payload}: {err:?}"
        );
        let err = ssrf::fetch(&guard, &url, 1024, Duration::from_millis(500))
            .await
            .expect_err(payload);
        assert!(
            matches!(err, SsrfError::Blocked { .. }),
            "{payload}: {err:?}"
        );
    }
    assert!(
        Url::parse("http://[fe80::1%25eth0]/").is_err(),
        "zone ids do not parse"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_local_server_is_fetched_and_converted() {
    let mut routes = Routes::new();
    routes.insert(
        "/page".into(),
        html(
            "<html><head><title>x</title><script>steal()</script></head><body>\
             <h1>Hello</h1><p>fish &amp; chips</p></body></html>",
        ),
    );
    routes.insert("/go".into(), redirect(302, "/page"));
    routes.insert(
        "/img".into(),
        (
            200,
            vec![("Content-Type".into(), "image/png".into())],
            "PNG".into(),
        ),
    );
    routes.insert("/loop".into(), redirect(302, "/loop"));
    routes.insert("/big".into(), html(&"a".repeat(5000)));
    let server = serve(routes).await;
    let s = server.port();
    let allow = vec![format!("127.0.0.1:{s}")];

    // Library level: redirect on the allowed host is followed.
    let guard = Guard::new(allow.clone());
    let url = Url::parse(&format!("http://127.0.0.1:{s}/go")).expect("url");
    let fetched = ssrf::fetch(&guard, &url, 1 << 20, Duration::from_secs(10))
        .await
        .expect("fetch allowed host");
    assert_eq!(fetched.status, 200);
    assert_eq!(fetched.final_url.path(), "/page");
    assert!(!fetched.truncated);

    // Byte cap.
    let url = Url::parse(&format!("http://127.0.0.1:{s}/big")).expect("url");
    let fetched = ssrf::fetch(&guard, &url, 100, Duration::from_secs(10))
        .await
        .expect("fetch big");
    assert_eq!(fetched.body.len(), 100);
    assert!(fetched.truncated);

    // Redirect loop stops.
    let url = Url::parse(&format!("http://127.0.0.1:{s}/loop")).expect("url");
    let err = ssrf::fetch(&guard, &url, 1024, Duration::from_secs(10))
        .await
        .expect_err("loop");
    assert!(matches!(err, SsrfError::TooManyRedirects(_)), "{err:?}");

    // Tool level: HTML converted, the final URL named (the registry wraps it as untrusted,
    // tested in tests/it/untrusted.rs).
    let tool = WebFetchTool::new(1 << 20, allow);
    assert!(tool.untrusted_output());
    let ctx = ctx();
    let out = tool
        .call(json!({"url": format!("http://127.0.0.1:{s}/go")}), &ctx)
        .await
        .expect("tool fetch");
    assert_eq!(
        out,
        format!("[fetched from http://127.0.0.1:{s}/page]\nHello\nfish & chips")
    );
    assert!(!out.contains("steal"), "{out}");

    let err = tool
        .call(json!({"url": format!("http://127.0.0.1:{s}/img")}), &ctx)
        .await
        .expect_err("image refused");
    assert!(err.to_string().contains("image/png"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_does_count_connections() {
    // Control for the battery: when the guard is told to allow the canary, it is reached.
    let canary = Canary::start();
    let guard = Guard::new(vec![format!("127.0.0.1:{}", canary.port)]);
    let url = Url::parse(&format!("http://127.0.0.1:{}/", canary.port)).expect("url");
    let _ = ssrf::fetch(&guard, &url, 1024, Duration::from_secs(2)).await;
    assert!(canary.finish() >= 1);
}
