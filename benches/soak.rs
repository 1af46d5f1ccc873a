//! Soak: the HTTP layer over a real socket for a long time, with everything that happens to a
//! payment service at once, sampled every few seconds to see whether anything grows or drifts.
//!
//! ```sh
//! cargo bench --features http --bench soak                          # 10 minutes
//! IDEMDB_SOAK_SECONDS=60 cargo bench --features http --bench soak   # a short look
//! ```
//!
//! The server: an axum server with the `IdempotencyLayer` (duplicates wait for the first
//! attempt, handlers run detached on tokio) over a store file on the build's disk
//! (`target/tmp`, or `IDEMDB_BENCH_DIR`). The clients: `IDEMDB_SOAK_CLIENTS` (64) threads with
//! their own connections, in a child process (this binary again, told so by
//! `IDEMDB_SOAK_CLIENTS_OF`), so that the memory and descriptors sampled are the server's
//! alone; the child reports each interval's requests on its standard output.
//!
//! Each request is a new payment, or a retry of a recent one (a duplicate, often while the
//! first is still running), or a reuse of a key with another amount; some clients give up after
//! 20 ms (the response is lost) and retry. Handlers answer 201, now and then 503 (the key is
//! released, the retry runs again), and now and then run past their lease (the retry takes
//! over). Beside it, `purge_expired` every second and `reap` every five (releasing what it
//! finds), and the store's clock, injected, runs 20 times faster than the real one, so a 60 s
//! TTL and a 5 s lease churn records all the time.
//!
//! Every 5 s it samples the server process's resident memory, open file descriptors, the store
//! and journal file sizes, live records, requests per second and their p99, and at the end prints
//! the table, whether each figure stayed flat after the first fifth (the warm-up), and writes
//! `soak.csv` and `soak.svg` (four panels over time) to `target/soak/`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use idemdb::http::IdempotencyLayer;
use idemdb::simulation::SplitMix64;
use idemdb::{ManualClock, Resolution, Store};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How much faster the store's clock runs than the real one.
const CLOCK_SPEED: u32 = 20;
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone)]
struct Handler {
    calls: Arc<AtomicU64>,
}

async fn pay(State(h): State<Handler>, body: Bytes) -> impl IntoResponse {
    let n = h.calls.fetch_add(1, Ordering::Relaxed);
    // Mostly quick; one in 400 runs past its lease (5 s of store time: 250 ms of real time);
    // one in 50 fails for the moment.
    let pause = match n % 400 {
        0 => Duration::from_millis(400),
        _ => Duration::from_micros(200 + (n % 7) * 300),
    };
    tokio::time::sleep(pause).await;
    if n % 50 == 7 {
        return (StatusCode::SERVICE_UNAVAILABLE, String::from("try again"));
    }
    (
        StatusCode::CREATED,
        format!(r#"{{"id":"pay_{n}","amount_bytes":{}}}"#, body.len()),
    )
}

/// Latencies of one sampling interval, in microseconds.
#[derive(Default)]
struct Interval {
    latencies: Vec<u64>,
    statuses: [u64; 6],
}

/// One figure read from a sample.
type Figure<'a> = &'a dyn Fn(&Sample) -> f64;

struct Sample {
    at: f64,
    rss_kib: u64,
    fds: u64,
    store_bytes: u64,
    live: u64,
    rps: f64,
    p99_ms: f64,
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

fn file_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum()
    })
}

fn client(base: &str, id: u64, stop: &AtomicBool, stats: &Mutex<Interval>) {
    let mut rng = SplitMix64::new(0x5eed ^ id);
    let patient: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let hasty: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_millis(20)))
        .build()
        .into();
    let tenant = format!("tenant-{}", id % 8);
    let mut recent: Vec<(String, u64)> = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let (key, amount) = match rng.below(10) {
            // A retry or duplicate of a recent payment.
            0..=2 if !recent.is_empty() => recent[rng.index(recent.len())].clone(),
            // A reused key with another amount (422).
            3 if !recent.is_empty() => {
                let (key, amount) = recent[rng.index(recent.len())].clone();
                (key, amount + 1)
            }
            _ => (format!("c{id}-{n}"), 100 + rng.below(10_000)),
        };
        if recent.len() < 32 {
            recent.push((key.clone(), amount));
        } else {
            let i = rng.index(32);
            recent[i] = (key.clone(), amount);
        }
        let agent = if rng.below(20) == 0 { &hasty } else { &patient };
        let began = Instant::now();
        let reply = agent
            .post(&format!("{base}/v1/payments"))
            .header("x-api-key", &tenant)
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .send(format!(r#"{{"amount":{amount},"currency":"eur"}}"#));
        let took = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
        let class = match reply {
            Ok(mut r) => {
                let _ = r.body_mut().read_to_vec();
                match r.status().as_u16() {
                    200..=299 => 0,
                    409 => 1,
                    422 => 2,
                    503 => 3,
                    _ => 4,
                }
            }
            Err(_) => 5, // gave up: the response is lost, a later request retries the key
        };
        let mut s = stats.lock().unwrap();
        s.statuses[class] += 1;
        if class != 5 {
            s.latencies.push(took);
        }
    }
}

/// The environment variable that makes this binary the clients' process, and the server's
/// address.
const CLIENTS_OF: &str = "IDEMDB_SOAK_CLIENTS_OF";

/// The clients' process: runs the client threads against `base` and prints, every
/// [`SAMPLE_EVERY`], one line `<2xx> <409> <422> <503> <other> <lost> <p99 us>`, until its
/// standard input closes (the server's process ended or killed it).
fn run_clients(base: &str, clients: u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Mutex::new(Interval::default()));
    for id in 0..clients {
        let (base, stop, stats) = (base.to_owned(), Arc::clone(&stop), Arc::clone(&stats));
        std::thread::spawn(move || client(&base, id, &stop, &stats));
    }
    {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
            stop.store(true, Ordering::Relaxed);
        });
    }
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(SAMPLE_EVERY);
        let interval = std::mem::take(&mut *stats.lock().unwrap());
        let mut lat = interval.latencies;
        lat.sort_unstable();
        let p99 = lat.get(lat.len() * 99 / 100).copied().unwrap_or(0);
        let st = interval.statuses;
        println!(
            "{} {} {} {} {} {} {p99}",
            st[0], st[1], st[2], st[3], st[4], st[5]
        );
    }
}

fn main() {
    let seconds = env("IDEMDB_SOAK_SECONDS", 600);
    let clients = env("IDEMDB_SOAK_CLIENTS", 64);
    if let Ok(base) = std::env::var(CLIENTS_OF) {
        run_clients(&base, clients);
        return;
    }
    let root = std::env::var_os("IDEMDB_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&root).unwrap();
    let dir = tempfile::tempdir_in(&root).unwrap();
    let clock = ManualClock::new();
    let store = Store::builder()
        .ttl(Duration::from_secs(60))
        .lease(Duration::from_secs(5))
        .clock(clock.clone())
        .open(dir.path().join("soak.idem"))
        .unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let layer = IdempotencyLayer::builder(store.clone(), |parts| {
        parts
            .headers
            .get("x-api-key")?
            .to_str()
            .ok()
            .map(str::to_owned)
    })
    .wait_for_in_flight(Duration::from_millis(200))
    .spawner(|f| {
        tokio::spawn(f);
    })
    .build();
    let handler = Handler {
        calls: Arc::new(AtomicU64::new(0)),
    };
    let app = Router::new()
        .route("/v1/payments", post(pay))
        .layer(layer)
        .with_state(handler.clone());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });

    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let mut clients_process = std::process::Command::new(std::env::current_exe().unwrap())
        .env(CLIENTS_OF, &base)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the clients' process");
    let reports = std::io::BufRead::lines(std::io::BufReader::new(
        clients_process.stdout.take().unwrap(),
    ));
    // The store's time, 20 times the real one; purge every second, reap every five.
    {
        let (stop, store, clock) = (Arc::clone(&stop), store.clone(), clock.clone());
        threads.push(std::thread::spawn(move || {
            let mut tick = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                clock.advance(Duration::from_millis(50) * CLOCK_SPEED);
                tick += 1;
                if tick.is_multiple_of(20) {
                    store.purge_expired().expect("purge");
                }
                if tick.is_multiple_of(100) {
                    store.reap(|_| Resolution::Release).expect("reap");
                }
            }
        }));
    }

    println!(
        "soak: {seconds} s, {clients} clients, store clock x{CLOCK_SPEED} (TTL 60 s, lease 5 s), \
         sampled every {} s, files in {}",
        SAMPLE_EVERY.as_secs(),
        dir.path().display()
    );
    println!("|   t s | RSS MiB | fds | files MiB | live records | req/s | p99 ms | 2xx | 409 | 422 | 503 | lost |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let began = Instant::now();
    let mut samples = Vec::new();
    for report in reports {
        if began.elapsed() >= Duration::from_secs(seconds) {
            break;
        }
        let figures: Vec<u64> = report
            .expect("a report from the clients")
            .split_whitespace()
            .map(|f| f.parse().expect("a figure"))
            .collect();
        let (st, p99) = (&figures[..6], figures[6]);
        let requests: u64 = st.iter().sum();
        let sample = Sample {
            at: began.elapsed().as_secs_f64(),
            rss_kib: rss_kib(),
            fds: fds(),
            store_bytes: file_bytes(dir.path()),
            live: store.record_count().unwrap(),
            rps: requests as f64 / SAMPLE_EVERY.as_secs_f64(),
            p99_ms: p99 as f64 / 1000.0,
        };
        println!(
            "| {:5.0} | {:7.1} | {:3} | {:9.1} | {:12} | {:5.0} | {:6.1} | {} | {} | {} | {} | {} |",
            sample.at,
            sample.rss_kib as f64 / 1024.0,
            sample.fds,
            sample.store_bytes as f64 / (1 << 20) as f64,
            sample.live,
            sample.rps,
            sample.p99_ms,
            st[0],
            st[1],
            st[2],
            st[3],
            st[5]
        );
        samples.push(sample);
    }
    stop.store(true, Ordering::Relaxed);
    drop(clients_process.stdin.take());
    let _ = clients_process.kill();
    let _ = clients_process.wait();
    for t in threads {
        t.join().unwrap();
    }
    let s = store.stats();
    println!(
        "store: {} acquired, {} replays, {} in progress, {} mismatches, {} completes, {} releases, \
         {} takeovers, {} reaped, {} purged, {} commit batches; handler ran {} times",
        s.acquired,
        s.replays,
        s.in_progress,
        s.mismatches,
        s.completes,
        s.releases,
        s.takeovers,
        s.reaped,
        s.purged,
        s.commit_batches,
        handler.calls.load(Ordering::Relaxed)
    );
    verdict(&samples);
    write_outputs(&samples);
}

/// Whether each figure stayed flat after the warm-up: the last fifth's mean against the
/// second fifth's, with a tolerance per figure.
fn verdict(samples: &[Sample]) {
    let n = samples.len();
    if n < 10 {
        println!("too few samples for a verdict ({n}); run longer");
        return;
    }
    let fifth = n / 5;
    let mean = |range: std::ops::Range<usize>, f: &dyn Fn(&Sample) -> f64| {
        samples[range.clone()].iter().map(f).sum::<f64>() / range.len() as f64
    };
    let early = fifth..2 * fifth;
    let late = n - fifth..n;
    let figures: [(&str, Figure, f64); 6] = [
        ("resident memory", &|s| s.rss_kib as f64, 0.10),
        ("open file descriptors", &|s| s.fds as f64, 0.10),
        ("store and journal bytes", &|s| s.store_bytes as f64, 0.10),
        ("live records", &|s| s.live as f64, 0.15),
        ("requests/s", &|s| s.rps, 0.15),
        ("p99 latency", &|s| s.p99_ms, 0.50),
    ];
    for (name, f, tolerance) in figures {
        let (a, b) = (mean(early.clone(), f), mean(late.clone(), f));
        let change = if a > 0.0 { (b - a) / a } else { 0.0 };
        let word = if change.abs() <= tolerance {
            "flat"
        } else {
            "DRIFTS"
        };
        println!(
            "{name}: {a:.1} after warm-up, {b:.1} at the end ({:+.1} %, tolerance {:.0} %): {word}",
            change * 100.0,
            tolerance * 100.0
        );
    }
}

fn write_outputs(samples: &[Sample]) {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../soak");
    std::fs::create_dir_all(&out).unwrap();
    let mut csv = String::from("t_s,rss_kib,fds,store_bytes,live_records,requests_per_s,p99_ms\n");
    for s in samples {
        let _ = writeln!(
            csv,
            "{:.1},{},{},{},{},{:.1},{:.2}",
            s.at, s.rss_kib, s.fds, s.store_bytes, s.live, s.rps, s.p99_ms
        );
    }
    std::fs::write(out.join("soak.csv"), csv).unwrap();
    let panels: [(&str, Figure); 4] = [
        ("resident memory, MiB", &|s| s.rss_kib as f64 / 1024.0),
        ("store + journal files, MiB", &|s| {
            s.store_bytes as f64 / (1 << 20) as f64
        }),
        ("requests/s", &|s| s.rps),
        ("p99 latency, ms", &|s| s.p99_ms),
    ];
    let (w, h, pad) = (460.0, 220.0, 40.0);
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">"#,
        2.0 * w,
        2.0 * h
    );
    let t_max = samples.last().map_or(1.0, |s| s.at).max(1.0);
    for (i, (title, f)) in panels.iter().enumerate() {
        let (x0, y0) = ((i % 2) as f64 * w, (i / 2) as f64 * h);
        let y_max = samples.iter().map(f).fold(0.0, f64::max).max(1e-9) * 1.1;
        let points: Vec<String> = samples
            .iter()
            .map(|s| {
                let x = x0 + pad + (s.at / t_max) * (w - 2.0 * pad);
                let y = y0 + h - pad - (f(s) / y_max) * (h - 2.0 * pad);
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = write!(
            svg,
            r##"<text x="{}" y="{}">{title}</text><rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#999"/><text x="{}" y="{}">{y_max:.1}</text><text x="{}" y="{}">0</text><text x="{}" y="{}">{t_max:.0} s</text><polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{}"/>"##,
            x0 + pad,
            y0 + pad - 8.0,
            x0 + pad,
            y0 + pad,
            w - 2.0 * pad,
            h - 2.0 * pad,
            x0 + 2.0,
            y0 + pad + 4.0,
            x0 + pad - 10.0,
            y0 + h - pad,
            x0 + w - pad - 30.0,
            y0 + h - pad + 14.0,
            points.join(" ")
        );
    }
    svg.push_str("</svg>\n");
    std::fs::write(out.join("soak.svg"), svg).unwrap();
    println!(
        "wrote {} and {}",
        out.join("soak.csv").display(),
        out.join("soak.svg").display()
    );
}
