//! The `main` of a test binary without the libtest harness (`harness = false`) that holds one
//! test and is also its own child process: it takes what `cargo test` passes on, so a name
//! filter skips the test unless it matches, and `--list` lists it.

/// Runs `test` as the binary's one test named `name`, unless `cargo test`'s arguments filter it
/// out.
pub(crate) fn run(name: &str, test: impl FnOnce()) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("{name}: test");
        return;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
        println!("running 0 tests (1 filtered out)");
        return;
    }
    println!("running 1 test");
    test();
    println!("test {name} ... ok");
}
