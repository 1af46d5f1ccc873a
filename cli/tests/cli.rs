//! The `idemdb` command, run as a user runs it: the real binary on real store files, through
//! its arguments, standard streams and exit codes.

use assert_cmd::Command;
use idemdb::{Claim, Fingerprint, ManualClock, Response, Scope, Store};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

fn idemdb() -> Command {
    Command::cargo_bin("idemdb").unwrap()
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Run {
    run_with(args, b"")
}

fn run_with(args: &[&str], stdin: &[u8]) -> Run {
    let out = idemdb().args(args).write_stdin(stdin).output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn json(args: &[&str]) -> Value {
    let r = run(args);
    assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", r.stdout))
}

fn pay() -> Scope {
    Scope::new("acme", "POST /pay")
}

fn acquire(store: &Store, scope: &Scope, key: &str) -> idemdb::Ticket {
    match store
        .claim(scope, key, Fingerprint::of(key.as_bytes()))
        .unwrap()
    {
        Claim::Acquired(t) => t,
        other => panic!("{key}: {other:?}"),
    }
}

/// A store file holding: `old` (completed two days ago: expired), `paid` (completed, a JSON
/// body), `binary` (completed, a body that is not UTF-8) and `stuck` (claimed, never
/// finished: an orphan once reopened), of tenant acme; `r1` (completed) of tenant bravo.
fn store_file(dir: &Path) -> PathBuf {
    let path = dir.join("payments.idem");
    let two_days_ago = SystemTime::now() - Duration::from_secs(2 * 86_400);
    let store = Store::builder()
        .clock(ManualClock::at(two_days_ago))
        .open(&path)
        .unwrap();
    let t = acquire(&store, &pay(), "old");
    store.complete(t, Response::new(201, "old")).unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    let t = acquire(&store, &pay(), "paid");
    let response =
        Response::new(201, r#"{"id":"pay_1"}"#).with_header("content-type", "application/json");
    store.complete(t, response).unwrap();
    let t = acquire(&store, &pay(), "binary");
    store
        .complete(t, Response::new(200, vec![0xff, 0xfe, 0x00]))
        .unwrap();
    let refund = Scope::new("bravo", "POST /refund");
    let t = acquire(&store, &refund, "r1");
    store.complete(t, Response::new(200, "refunded")).unwrap();
    std::mem::forget(acquire(&store, &pay(), "stuck")); // as if the handler crashed
    drop(store);
    path
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn bad_arguments_exit_2_and_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(dir.path());
    let s = p(&path);
    let resolve = |extra: &[&'static str]| {
        let mut args = vec!["resolve", s, "acme", "POST /pay", "stuck", "--fence", "1"];
        args.extend_from_slice(extra);
        args
    };
    for (args, says) in [
        (vec![], "Usage"),
        (vec!["stats"], "<STORE>"),
        (vec!["frobnicate", s], "unrecognized subcommand"),
        (vec!["list", s, "--state", "bogus"], "unknown status"),
        (vec!["list", s, "--older-than", "5x"], "not a duration"),
        (vec!["list", s, "--limit", "-1"], "-1"),
        (resolve(&[]), "--release"),
        (
            resolve(&["--release", "--complete", "200"]),
            "cannot be used with",
        ),
        (resolve(&["--complete", "999"]), "999"),
        (
            resolve(&["--release", "--body", "x"]),
            "cannot be used with",
        ),
    ] {
        let r = run(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }
    // A key that is not a valid idempotency key is bad input too, and changes nothing.
    let r = run(&[
        "resolve",
        s,
        "acme",
        "POST /pay",
        "bad key",
        "--fence",
        "1",
        "--release",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("key"), "{}", r.stderr);
}

/// A `--schema` the library refuses is bad input: exit 2, saying what a good name is, before
/// anything is connected to (the port below has no server). Broke: the command checked its own
/// copy of the rule, which allowed `pg_` names, and the library's builder then panicked on them.
#[cfg(feature = "postgres")]
#[test]
fn a_bad_schema_name_is_exit_2_and_says_what_a_good_one_is() {
    let url = "postgres://127.0.0.1:1/x";
    let long = "a".repeat(64);
    for (schema, says) in [
        ("pg_x", "pg_"),
        ("Bad-Name", "byte 0"),
        ("", "empty"),
        (long.as_str(), "64 bytes"),
    ] {
        for json in [false, true] {
            let mut args = vec!["--schema", schema, "stats", url];
            if json {
                args.insert(0, "--json");
            }
            let r = run(&args);
            assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
            assert!(!r.stderr.contains("panicked"), "{args:?}: {}", r.stderr);
            for part in [says, "--schema", "lower-case ASCII letters, digits and _"] {
                assert!(r.stderr.contains(part), "{args:?}: {}", r.stderr);
            }
            if json {
                let doc: Value = serde_json::from_str(&r.stdout).unwrap();
                assert_eq!(doc["exit"], 2, "{}", r.stdout);
            }
        }
    }
}

#[test]
fn a_missing_store_is_exit_3_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.idem");
    for cmd in ["stats", "list", "purge", "verify", "export"] {
        let r = run(&[cmd, p(&path)]);
        assert_eq!(r.code, 3, "{cmd}: {}", r.stderr);
        assert!(r.stderr.contains("no store at"), "{}", r.stderr);
        assert!(!path.exists(), "{cmd} created the store");
    }
    let r = run(&["--json", "stats", p(&path)]);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["exit"], 3);
    assert!(v["error"].as_str().unwrap().contains("no store at"));
}

#[test]
fn stats_list_and_get_show_what_the_store_holds() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(dir.path());
    let s = p(&path);
    let stats = json(&["--json", "stats", s]);
    assert_eq!(stats["records"], 5);
    assert_eq!(stats["by_status"]["completed"], 3);
    assert_eq!(stats["by_status"]["expired"], 1);
    assert_eq!(
        stats["by_status"]["orphan"], 1,
        "a claim left by a previous process"
    );
    assert_eq!(stats["by_tenant"]["acme"]["completed"], 2);
    assert_eq!(stats["by_tenant"]["bravo"]["completed"], 1);
    assert_eq!(stats["oldest_claim"]["key"], "stuck");
    assert!(stats["file_bytes"].as_u64().unwrap() > 0);
    assert!(stats["journal_bytes"].as_u64().unwrap() > 0);
    let human = run(&["stats", s]);
    assert_eq!(human.code, 0, "{}", human.stderr);
    assert!(human.stdout.contains("orphan"), "{}", human.stdout);
    assert!(human.stdout.contains("\"bravo\""), "{}", human.stdout);

    let keys = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["--json", "list", s];
        all.extend_from_slice(args);
        json(&all)
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(keys(&[]), ["old", "paid", "binary", "r1", "stuck"]);
    assert_eq!(keys(&["--state", "orphan"]), ["stuck"]);
    assert_eq!(
        keys(&["--state", "expired", "--state", "orphan"]),
        ["old", "stuck"]
    );
    assert_eq!(keys(&["--tenant", "bravo"]), ["r1"]);
    assert_eq!(
        keys(&["--endpoint", "POST /pay", "--limit", "2"]),
        ["old", "paid"]
    );
    assert_eq!(keys(&["--older-than", "1d"]), ["old"]);
    let table = run(&["list", s, "--state", "completed"]);
    assert_eq!(table.code, 0);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three rows: {}", table.stdout);
    assert!(
        lines[0].starts_with("fence") && lines[1].contains("paid"),
        "{}",
        table.stdout
    );
    // Columns line up: every row's status starts where the header's does.
    let at = lines[0].find("status").unwrap();
    assert!(
        lines[1..].iter().all(|l| l[at..].starts_with("completed")),
        "{}",
        table.stdout
    );

    let paid = json(&["--json", "get", s, "acme", "POST /pay", "paid"]);
    assert_eq!(paid["status"], "completed");
    assert_eq!(paid["http_status"], 201);
    assert_eq!(paid["body"]["encoding"], "utf-8");
    assert_eq!(paid["body"]["text"], r#"{"id":"pay_1"}"#);
    assert_eq!(paid["headers"][0]["name"], "content-type");
    let binary = json(&["--json", "get", s, "acme", "POST /pay", "binary"]);
    assert_eq!(binary["body"]["encoding"], "base64");
    assert_eq!(binary["body"]["text"], "//4A");
    let human = run(&["get", s, "acme", "POST /pay", "paid"]);
    assert!(
        human.stdout.contains(r#"{"id":"pay_1"}"#),
        "{}",
        human.stdout
    );
    let missing = run(&["get", s, "acme", "POST /pay", "never"]);
    assert_eq!(missing.code, 6, "{}", missing.stderr);
    // An expired record is gone for claims, and for get.
    assert_eq!(run(&["get", s, "acme", "POST /pay", "old"]).code, 6);
}

#[test]
fn resolve_is_fenced_and_completes_or_releases_a_stuck_claim() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(dir.path());
    let s = p(&path);
    let stuck = json(&["--json", "get", s, "acme", "POST /pay", "stuck"]);
    assert_eq!(stuck["status"], "orphan");
    let fence = stuck["fence"].as_u64().unwrap();

    // The wrong fence changes nothing.
    let wrong = (fence + 1).to_string();
    let r = run(&[
        "resolve",
        s,
        "acme",
        "POST /pay",
        "stuck",
        "--fence",
        &wrong,
        "--release",
    ]);
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert!(r.stderr.contains("nothing changed"), "{}", r.stderr);
    assert_eq!(
        json(&["--json", "get", s, "acme", "POST /pay", "stuck"])["status"],
        "orphan"
    );
    // A completed key is not a claim to resolve.
    let paid = json(&["--json", "get", s, "acme", "POST /pay", "paid"])["fence"].to_string();
    let r = run(&[
        "resolve",
        s,
        "acme",
        "POST /pay",
        "paid",
        "--fence",
        &paid,
        "--release",
    ]);
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert!(r.stderr.contains("already completed"), "{}", r.stderr);

    // The right fence completes it with the response the side effect should have had.
    let body = dir.path().join("body.json");
    std::fs::write(&body, r#"{"id":"pay_9"}"#).unwrap();
    let f = fence.to_string();
    let r = run(&[
        "resolve",
        s,
        "acme",
        "POST /pay",
        "stuck",
        "--fence",
        &f,
        "--complete",
        "201",
        "--body",
        p(&body),
        "--header",
        "Content-Type: application/json",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let store = Store::open(&path).unwrap();
    let Claim::Replay(replayed) = store
        .claim(&pay(), "stuck", Fingerprint::of(b"stuck"))
        .unwrap()
    else {
        panic!("the retry replays what the operator stored")
    };
    assert_eq!(replayed.status(), 201);
    assert_eq!(replayed.body(), br#"{"id":"pay_9"}"#);
    assert_eq!(
        replayed.headers(),
        [("content-type".to_owned(), b"application/json".to_vec())]
    );
    // Release: the retry runs the side effect again.
    let t = acquire(&store, &pay(), "again");
    let fence = t.fence().to_string();
    std::mem::forget(t);
    drop(store);
    let r = run(&[
        "--json",
        "resolve",
        s,
        "acme",
        "POST /pay",
        "again",
        "--fence",
        &fence,
        "--release",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let store = Store::open(&path).unwrap();
    assert!(matches!(
        store
            .claim(&pay(), "again", Fingerprint::of(b"again"))
            .unwrap(),
        Claim::Acquired(_)
    ));
}

#[test]
fn purge_deletes_only_what_expired() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(dir.path());
    let s = p(&path);
    let r = json(&["--json", "purge", s]);
    assert_eq!(r["purged"], 1);
    let stats = json(&["--json", "stats", s]);
    assert_eq!(stats["records"], 4);
    assert_eq!(stats["by_status"]["expired"], 0);
    assert_eq!(json(&["--json", "purge", s])["purged"], 0);
}

#[test]
fn verify_passes_a_sound_store_and_names_the_damage_in_a_damaged_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(dir.path());
    let s = p(&path);
    let ok = json(&["--json", "verify", s]);
    assert_eq!(ok["ok"], true);
    assert_eq!(ok["records"], 5);

    // A store file cut short.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let r = run(&["verify", s]);
    assert_eq!(r.code, 5, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("DAMAGED"), "{}", r.stdout);
    let v: Value = serde_json::from_str(&run(&["--json", "verify", s]).stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert!(!v["damage"].as_str().unwrap().is_empty());
    // Every command refuses the damaged file the same way, and leaves it as it was.
    assert_eq!(run(&["stats", s]).code, 5);
    assert_eq!(std::fs::read(&path).unwrap(), &bytes[..bytes.len() / 2]);

    // Not a store at all.
    let junk = dir.path().join("junk.idem");
    std::fs::write(&junk, vec![0x5a; 64 << 10]).unwrap();
    let r = run(&["verify", p(&junk)]);
    assert_eq!(r.code, 5, "{}\n{}", r.stdout, r.stderr);
}

#[test]
fn verify_names_the_one_damaged_record_by_key_and_fence() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(dir.path());
    let claimed = json(&["--json", "get", p(&path), "acme", "POST /pay", "paid"])["fence"]
        .as_u64()
        .unwrap();
    let fence;
    {
        // One byte of the record's body flipped, inside a valid redb page: only idemdb's own
        // checksum can see it.
        use redb::ReadableTable as _;
        const RECORDS: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("records");
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(RECORDS).unwrap();
            // A completion is stored at a fence of its own, after its claim's: the one record
            // whose scoped key is "POST /pay" and "paid".
            let paid = |v: &[u8]| v.windows(13).any(|w| w == b"POST /paypaid");
            let stored: Vec<u64> = table
                .iter()
                .unwrap()
                .map(|r| r.unwrap())
                .filter(|(_, v)| paid(v.value()))
                .map(|(k, _)| k.value())
                .collect();
            assert_eq!(stored.len(), 1, "{stored:?}");
            fence = stored[0];
            assert!(fence > claimed);
            let mut value = table.get(fence).unwrap().unwrap().value().to_vec();
            let last = value.len() - 5;
            value[last] ^= 0x20;
            table.insert(fence, value.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let r = run(&["--json", "verify", p(&path)]);
    assert_eq!(r.code, 5, "{}\n{}", r.stdout, r.stderr);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    let damage = v["damage"].as_str().unwrap();
    assert!(damage.contains(&format!("fence {fence}")), "{damage}");
    assert!(damage.contains("paid"), "{damage}");
    assert!(damage.contains("crc32"), "{damage}");
}

/// `verify` checks every page of the file, which a service's open (pages trusted, the default)
/// does not: a byte flipped in a stored response, which that open never reads (it loads the
/// heads alone), passes a service's open and is found by `verify`.
#[test]
fn verify_checks_pages_a_trusting_open_never_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(dir.path());
    // Every copy: the live leaf, and any freed page that still holds one.
    let needle = br#"{"id":"pay_1"}"#;
    let mut bytes = std::fs::read(&path).unwrap();
    let at: Vec<usize> = (0..bytes.len() - needle.len())
        .filter(|&i| &bytes[i..i + needle.len()] == needle)
        .collect();
    assert!(!at.is_empty(), "the response is in the file");
    for i in at {
        bytes[i + 2] ^= 0xff;
    }
    std::fs::write(&path, &bytes).unwrap();
    drop(Store::open(&path).expect("a service's open reads no response"));
    let r = run(&["--json", "verify", p(&path)]);
    assert_eq!(r.code, 5, "{}\n{}", r.stdout, r.stderr);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["ok"], false);
}

#[test]
fn a_store_held_by_another_process_is_exit_4_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(dir.path());
    let held = Store::open(&path).unwrap(); // this test's process is the running service
    for cmd in ["stats", "verify", "export"] {
        let r = run(&[cmd, p(&path)]);
        assert_eq!(r.code, 4, "{cmd}: {}", r.stderr);
        assert!(r.stderr.contains("open in another process"), "{}", r.stderr);
        assert!(r.stderr.contains("Store::scan"), "{}", r.stderr);
    }
    drop(held);
    assert_eq!(run(&["stats", p(&path)]).code, 0);
}

#[test]
fn an_export_imported_into_a_new_file_holds_the_same_live_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(dir.path());
    let export = run(&["export", p(&path)]);
    assert_eq!(export.code, 0, "{}", export.stderr);
    assert_eq!(
        export.stdout.lines().count(),
        4,
        "the expired record is not exported"
    );
    assert!(
        export.stderr.contains("exported 4 records"),
        "{}",
        export.stderr
    );

    let copy = dir.path().join("copy.idem");
    let r = run_with(&["--json", "import", p(&copy)], export.stdout.as_bytes());
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap()["imported"],
        4
    );
    let listed = |path: &Path| -> Vec<(String, u64)> {
        json(&[
            "--json",
            "list",
            p(path),
            "--state",
            "completed",
            "--state",
            "orphan",
        ])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["fence"].as_u64().unwrap(),
            )
        })
        .collect()
    };
    assert_eq!(listed(&copy), listed(&path));

    // An existing file is never imported into; a bad line imports nothing.
    let before = std::fs::read(&copy).unwrap();
    let r = run_with(&["import", p(&copy)], export.stdout.as_bytes());
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert_eq!(std::fs::read(&copy).unwrap(), before);
    let other = dir.path().join("other.idem");
    let r = run_with(&["import", p(&other)], b"{\"v\":1}\n");
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("line 1"), "{}", r.stderr);
    assert!(!other.exists());
}

/// The same commands on a PostgreSQL store (`scripts/with-postgres` starts the server).
#[cfg(feature = "postgres")]
#[test]
fn the_commands_work_on_a_postgres_url() {
    let port = std::env::var("IDEMDB_PG_PORT").expect(
        "IDEMDB_PG_PORT is not set: run `scripts/with-postgres cargo test --release --features postgres`",
    );
    let url = format!("postgres://postgres@127.0.0.1:{port}/idem");
    let schema = format!("cli_{}", std::process::id());
    let store = Store::builder()
        .schema(schema.clone())
        .lease(Duration::from_millis(50))
        .connect(&url)
        .unwrap();
    let t = acquire(&store, &pay(), "paid");
    store.complete(t, Response::new(201, "paid")).unwrap();
    let stuck = acquire(&store, &pay(), "stuck");
    let fence = stuck.fence().to_string();
    std::mem::forget(stuck);
    std::thread::sleep(Duration::from_millis(100)); // its lease ran out: stale

    let args = |rest: &[&str]| -> Vec<String> {
        let mut v = vec!["--json".to_owned(), "--schema".to_owned(), schema.clone()];
        v.extend(rest.iter().map(|s| (*s).to_owned()));
        v
    };
    let j = |rest: &[&str]| json(&args(rest).iter().map(String::as_str).collect::<Vec<_>>());
    let stats = j(&["stats", &url]);
    assert_eq!(stats["by_status"]["completed"], 1);
    assert_eq!(stats["by_status"]["stale"], 1);
    assert_eq!(j(&["list", &url, "--state", "stale"])[0]["key"], "stuck");
    assert_eq!(
        j(&["get", &url, "acme", "POST /pay", "paid"])["body"]["text"],
        "paid"
    );
    j(&[
        "resolve",
        &url,
        "acme",
        "POST /pay",
        "stuck",
        "--fence",
        &fence,
        "--release",
    ]);
    assert!(matches!(
        store
            .claim(&pay(), "stuck", Fingerprint::of(b"stuck"))
            .unwrap(),
        Claim::Acquired(_)
    ));
    assert_eq!(j(&["verify", &url])["ok"], true);

    let export = run(&["--schema", &schema, "export", &url]);
    assert_eq!(export.code, 0, "{}", export.stderr);
    let other = format!("{schema}_copy");
    let r = run_with(
        &["--json", "--schema", &other, "import", &url],
        export.stdout.as_bytes(),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap()["imported"],
        2
    );
    let r = run(&["--schema", "Bad-Name", "stats", &url]);
    assert_eq!(r.code, 2, "{}", r.stderr);
}

/// Damage in several stored bodies: `verify` names every damaged record (key and fence), not
/// the first it meets; `export --past-damage` writes every other record, names the damaged ones
/// on standard error and exits 5; and `import` carries what was exported into a new store that
/// replays it. The recovery path the damage message suggests.
#[test]
fn verify_lists_every_damaged_record_and_export_past_damage_carries_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.idem");
    let scope = pay();
    {
        let store = Store::open(&path).unwrap();
        for i in 0..40 {
            let key = format!("k{i:02}");
            let t = acquire(&store, &scope, &key);
            let body = format!("body-of-{key}-{}", "z".repeat(300));
            store.complete(t, Response::new(201, body)).unwrap();
        }
    }
    // Three bodies damaged wherever they stand (the live leaf, and any stale copy).
    let mut bytes = std::fs::read(&path).unwrap();
    for key in ["k05", "k17", "k33"] {
        let needle = format!("body-of-{key}-");
        let at: Vec<usize> = (0..bytes.len() - needle.len())
            .filter(|&i| &bytes[i..i + needle.len()] == needle.as_bytes())
            .collect();
        assert!(!at.is_empty(), "{key}'s body is in the file");
        for i in at {
            bytes[i] ^= 0x20;
        }
    }
    std::fs::write(&path, &bytes).unwrap();

    let r = run(&["--json", "verify", p(&path)]);
    assert_eq!(r.code, 5, "{}\n{}", r.stdout, r.stderr);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    let listed: Vec<&str> = v["damaged_records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 3, "{listed:?}");
    for key in ["k05", "k17", "k33"] {
        assert!(
            listed
                .iter()
                .any(|d| d.contains(key) && d.contains("fence")),
            "{key} in {listed:?}"
        );
    }

    let export = run(&["export", "--past-damage", p(&path)]);
    assert_eq!(export.code, 5, "{}", export.stderr);
    assert_eq!(export.stdout.lines().count(), 37);
    assert_eq!(
        export.stderr.matches("left out:").count(),
        3,
        "{}",
        export.stderr
    );

    let new = dir.path().join("salvaged.idem");
    let import = run_with(&["import", p(&new)], export.stdout.as_bytes());
    assert_eq!(import.code, 0, "{}", import.stderr);
    let store = Store::open(&new).unwrap();
    assert_eq!(store.record_count().unwrap(), 37);
    match store.claim(&scope, "k06", Fingerprint::of(b"k06")).unwrap() {
        Claim::Replay(r) => assert!(r.body().starts_with(b"body-of-k06-")),
        other => panic!("an intact record replays: {other:?}"),
    }
}
