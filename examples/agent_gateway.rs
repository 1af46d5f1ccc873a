//! An agent harness calling side-effecting tools through idemdb's gateway, effectively-once.
//!
//! ```text
//! cargo run --release --example agent_gateway [-- SEED]
//! ```
//!
//! Three agents work through incident-response plans at the same time, one tool call per step,
//! against an incident tool server whose tools (`create_incident`, `page_oncall`) are NOT
//! idempotent: every call that reaches them creates an incident or sends a page. Between the
//! model and a second incident stand the faults a real harness meets:
//!
//! - the server is slow: it creates the incident but answers after the harness stopped waiting,
//!   so the model sees a timeout, and retries with reworded arguments;
//! - the server answers 503 without doing anything, and the retry must really run;
//! - the runtime sends one tool call twice at once;
//! - halfway through, the agent process crashes with tool calls in flight; it restarts on the
//!   same store file and resumes every agent from its last checkpoint, replaying the steps after
//!   it.
//!
//! What keeps it to one side effect per step is the key: the harness derives it from (run id,
//! step number, tool name), and the gateway claims it before the tool runs. It never depends on
//! the arguments, and the model never sees it. At the end every logical step must have exactly
//! one side effect on the server, and the agents' transcripts must name it; the example exits
//! non-zero otherwise.
//!
//! Every fault is drawn from a small seeded PRNG (per agent, and per tool-server call), and every
//! duration is simulated (nothing sleeps for it), so a seed always tells the same story.

use idemdb::agent::{Gateway, Outcome, ToolCallKey};
use idemdb::{Attempt, Failure, ManualClock, Stats, Store};
use std::collections::{BTreeMap, HashMap};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

const DEFAULT_SEED: u64 = 42;

/// The agents. Each acts for its own tenant (the scope of its records: two tenants never share
/// one) and works through one run of a plan. `crash` is where it is when the process dies.
const AGENTS: [AgentSpec; 3] = [
    AgentSpec {
        name: "triage",
        tenant: "acme/sre-triage",
        crash: Crash {
            step: 6,
            how: Death::AfterTheEffect,
        },
    },
    AgentSpec {
        name: "database",
        tenant: "acme/db-oncall",
        crash: Crash {
            step: 7,
            how: Death::BeforeTheRequest,
        },
    },
    AgentSpec {
        name: "edge",
        tenant: "acme/edge",
        crash: Crash {
            step: 8,
            how: Death::BetweenSteps,
        },
    },
];

/// The harness checkpoints each agent (its transcript, here just the step reached) after every
/// this many steps. A resumed agent replays the steps after its last checkpoint.
const CHECKPOINT_EVERY: u64 = 4;

// Simulated durations. Nothing sleeps for them: the tool server reports how long it took, and
// the store's clock is a `ManualClock` that only the crash moves.
/// How long the harness waits for a tool's answer before it tells the model "timeout".
const HARNESS_DEADLINE: Duration = Duration::from_secs(30);
/// How long the tool server usually takes, and how long it takes when it is slow.
const SERVER_LATENCY: Duration = Duration::from_millis(300);
const SERVER_SLOW: Duration = Duration::from_secs(45);
/// How long a claim is held before a later attempt may take it over. Far longer than any live
/// call; it is how long a crashed call's key stays blocked.
const LEASE: Duration = Duration::from_secs(30);
/// How long the crashed process takes to come back. Longer than the lease, so the calls it
/// left in flight can be taken over (a quicker restart would see `InProgress` until the lease
/// ran out, or could `Gateway::reap` them at once).
const DOWNTIME: Duration = Duration::from_secs(45);

// Real durations (short: the simulated tools answer in microseconds).
/// How long a duplicate of a running call waits in the gateway for its result.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(2);
/// The longest the harness backs off after an `InProgress` answer.
const MAX_BACKOFF: Duration = Duration::from_millis(5);

// Fault rates, in per mille.
/// A tool-server call answers 503 and does nothing.
const UNAVAILABLE: u64 = 120;
/// A tool-server call does its work, but answers after the harness's deadline.
const SLOW: u64 = 150;
/// The runtime sends a step's first tool call twice at once.
const DUPLICATE: u64 = 200;

fn main() -> ExitCode {
    let seed = match std::env::args().nth(1).map(|s| s.parse::<u64>()) {
        None => DEFAULT_SEED,
        Some(Ok(seed)) => seed,
        Some(Err(_)) => {
            eprintln!("usage: agent_gateway [SEED]   (SEED is an unsigned integer)");
            return ExitCode::from(2);
        }
    };
    silence_simulated_crashes();
    match run(seed) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(seed: u64) -> Result<bool, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("agent.idem");
    let world = World::new(seed, dir.path());
    let steps: usize = world.plans.iter().map(Vec::len).sum();
    println!("idemdb agent gateway demo, seed {seed}");
    println!(
        "  {} agents, {steps} logical steps, one side-effecting tool call each; store {}",
        AGENTS.len(),
        path.display()
    );
    // The store's clock. Leases are measured on it, and it moves only across the crash, so a
    // live call is never taken over, and a crashed one is, once the process is back.
    let clock = ManualClock::new();

    println!("\nlifetime 1: the agents run until the process crashes");
    let first = world.lifetime(Lifetime::First, open_store(&path, &clock)?)?;
    print_logs(&first.logs);
    let in_flight = AGENTS
        .iter()
        .filter(|a| a.crash.how != Death::BetweenSteps)
        .count();
    println!(
        "  CRASH: the process dies with {in_flight} tool calls in flight; their claims stay \
         in progress on disk"
    );

    // The process is gone; everything it held in memory with it. It comes back on the same
    // store file after DOWNTIME, and resumes each agent from its last checkpoint.
    clock.advance(DOWNTIME);
    println!(
        "\nlifetime 2: restarted {}s later (lease {}s); every agent resumes from its checkpoint",
        DOWNTIME.as_secs(),
        LEASE.as_secs()
    );
    let second = world.lifetime(Lifetime::Resumed, open_store(&path, &clock)?)?;
    print_logs(&second.logs);

    let problems = world.verify(&first.logs, &second.logs, in_flight);
    world.report(steps, [first.stats, second.stats]);
    println!("  elapsed                        {:.2?}", started.elapsed());
    if problems.is_empty() {
        println!(
            "\nOK: exactly one side effect per logical step ({steps}), and every transcript \
             names it"
        );
        Ok(true)
    } else {
        for problem in &problems {
            eprintln!("FAIL: {problem}");
        }
        Ok(false)
    }
}

fn open_store(path: &Path, clock: &ManualClock) -> idemdb::Result<Store> {
    Store::builder()
        .clock(clock.clone())
        .lease(LEASE)
        // The hint an `InProgress` answer carries; the gateway also naps on it while it waits.
        .retry_after(Duration::from_millis(2))
        .open(path)
}

// ---------------------------------------------------------------------------------------------
// The agents and their plans.

struct AgentSpec {
    name: &'static str,
    tenant: &'static str,
    crash: Crash,
}

/// Where an agent is when the process dies, in lifetime 1.
struct Crash {
    step: u64,
    how: Death,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Death {
    /// Inside the tool call, after the tool server created the incident and before the gateway
    /// stored the result: the worst moment. The claim is on disk, in progress.
    AfterTheEffect,
    /// Inside the tool call, after the claim and before the request left: nothing happened on
    /// the server, but the claim cannot know that.
    BeforeTheRequest,
    /// Between two steps: nothing is in flight.
    BetweenSteps,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    CreateIncident,
    PageOncall,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::CreateIncident => "create_incident",
            Tool::PageOncall => "page_oncall",
        }
    }
}

/// One step of a plan: what the model means to do. How it words it varies.
struct PlanStep {
    number: u64,
    tool: Tool,
    service: &'static str,
    symptom: &'static str,
    team: &'static str,
    /// Which phrasing the model reaches for first.
    wording: u64,
}

const SERVICES: [&str; 6] = [
    "checkout-api",
    "payments-db",
    "search-index",
    "auth-gateway",
    "email-worker",
    "cdn-edge",
];
const SYMPTOMS: [&str; 5] = [
    "p99 latency above 2s",
    "error rate at 12%",
    "disk 95% full",
    "replication lag 40s",
    "TLS handshake failures",
];
const TEAMS: [&str; 3] = ["sre", "dba", "network"];

fn plan(seed: u64, agent: usize) -> Vec<PlanStep> {
    let mut rng = SplitMix64::new(seed, 0x91a9 + agent as u64);
    let steps = 10 + rng.below(5);
    (1..=steps)
        .map(|number| PlanStep {
            number,
            tool: if number == 1 || rng.chance(600) {
                Tool::CreateIncident
            } else {
                Tool::PageOncall
            },
            service: rng.pick(&SERVICES),
            symptom: rng.pick(&SYMPTOMS),
            team: rng.pick(&TEAMS),
            wording: rng.below(4),
        })
        .collect()
}

/// The model. It chooses the words of a tool call, never its key. After an error it rewords
/// the call (a model reasons that the first phrasing may have been the problem), and a model
/// resumed from a checkpoint regenerates a step, not always with the same words.
struct Model {
    rng: SplitMix64,
    resumed: bool,
}

impl Model {
    fn first_wording(&mut self, step: &PlanStep) -> u64 {
        if self.resumed {
            step.wording + self.rng.below(2)
        } else {
            step.wording
        }
    }

    /// The arguments, as JSON.
    fn arguments(step: &PlanStep, wording: u64) -> String {
        let (service, symptom) = (step.service, step.symptom);
        match step.tool {
            Tool::CreateIncident => {
                let description = match wording % 4 {
                    0 => format!("{symptom} on {service} since the last deploy"),
                    1 => format!("{service} is degraded: {symptom}"),
                    2 => format!("Customer impact likely, {service} shows {symptom}"),
                    _ => format!("Investigating {symptom} affecting {service}"),
                };
                format!(
                    r#"{{"title":"{service}: {symptom}","severity":"sev2","description":"{description}"}}"#
                )
            }
            Tool::PageOncall => {
                let message = match wording % 4 {
                    0 => format!("Please look at {service}: {symptom}"),
                    1 => format!("{service} needs eyes now ({symptom})"),
                    2 => format!("Urgent: {symptom} on {service}"),
                    _ => format!("On-call needed for {service}: {symptom}"),
                };
                format!(r#"{{"team":"{}","message":"{message}"}}"#, step.team)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The harness.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lifetime {
    First,
    Resumed,
}

/// Everything that outlives the agent process: the tool server (another process), the
/// checkpoints (the harness's own durable state) and the counters of the demo.
struct World {
    seed: u64,
    plans: Vec<Vec<PlanStep>>,
    runs: Vec<String>,
    server: ToolServer,
    metrics: Metrics,
    checkpoints: PathBuf,
}

struct LifetimeResult {
    logs: Vec<AgentLog>,
    stats: Stats,
}

/// One agent's transcript in one lifetime: the lines to print and the answer of every step.
struct AgentLog {
    lines: Vec<String>,
    /// Step number -> the id its tool call answered with.
    answers: BTreeMap<u64, String>,
}

/// How the first call of a step goes out.
#[derive(Debug, Clone, Copy)]
enum FirstCall {
    Once,
    /// The runtime sends it twice at once.
    Twice,
    /// The process dies inside it (lifetime 1, at the agent's crash step).
    DiesInside(Death),
}

/// How one step ended.
enum StepEnd {
    Answered {
        id: String,
        trail: String,
        /// For a reworded retry that collapsed: the first call's arguments and the retry's.
        reworded: Option<(String, String)>,
    },
    Died {
        trail: String,
    },
}

/// One tool call as the harness experienced it.
struct Sent {
    heard: Heard,
    /// What happened, for the transcript.
    note: String,
    /// The tool ran in this call and the server took longer than the harness waits.
    slow: bool,
    /// A replay for reworded arguments.
    arguments_changed: bool,
}

impl Sent {
    fn new(heard: Heard, note: &str) -> Sent {
        Sent {
            heard,
            note: note.to_owned(),
            slow: false,
            arguments_changed: false,
        }
    }
}

/// What the tool run inside one gateway call reported back to the harness.
#[derive(Default)]
struct ToolRun {
    /// How long the tool server took.
    took: Duration,
    /// What a takeover's reconciliation found.
    reconciled: Option<String>,
}

enum Heard {
    Answer(Vec<u8>),
    /// No answer in time: the model cannot tell "never happened" from "answer lost".
    Timeout,
    /// An error the model sees (a released 503).
    Error,
    /// Another attempt of this call is running: come back later, same arguments.
    Busy(Duration),
    /// The process died inside the call.
    Died,
}

impl World {
    fn new(seed: u64, dir: &Path) -> World {
        World {
            seed,
            plans: (0..AGENTS.len()).map(|i| plan(seed, i)).collect(),
            runs: (0..AGENTS.len())
                .map(|i| format!("run-{:04x}", mix(seed ^ (i as u64 + 1)) & 0xffff))
                .collect(),
            server: ToolServer::new(seed),
            metrics: Metrics::default(),
            checkpoints: dir.to_path_buf(),
        }
    }

    /// One process lifetime: a gateway over `store`, every agent on its own thread.
    fn lifetime(&self, lifetime: Lifetime, store: Store) -> idemdb::Result<LifetimeResult> {
        // One gateway for every agent: the policy lives here, not in each agent or tool.
        let gateway = Gateway::builder(store)
            // A duplicate of a running call waits for its result instead of answering at once.
            .wait_for_in_flight(IN_FLIGHT_WAIT)
            .build();
        let logs = thread::scope(|s| {
            let gateway = &gateway;
            let agents: Vec<_> = (0..AGENTS.len())
                .map(|i| s.spawn(move || self.run_agent(gateway, i, lifetime)))
                .collect();
            agents
                .into_iter()
                .map(|a| a.join().expect("agent thread"))
                .collect::<idemdb::Result<Vec<_>>>()
        })?;
        let stats = gateway.store().stats();
        // Dropping the gateway drops the last handle on the store and closes the file. After
        // lifetime 1 that is the crash: nothing is completed or released on the way out, so the
        // calls that died in flight stay in progress on disk, as if the process were killed.
        drop(gateway);
        Ok(LifetimeResult { logs, stats })
    }

    fn run_agent(
        &self,
        gateway: &Gateway,
        agent: usize,
        lifetime: Lifetime,
    ) -> idemdb::Result<AgentLog> {
        let spec = &AGENTS[agent];
        let (plan, run) = (&self.plans[agent], &self.runs[agent]);
        let salt = ((agent as u64) << 8) | lifetime as u64;
        let mut model = Model {
            rng: SplitMix64::new(self.seed, 0x30de1 + salt),
            resumed: lifetime == Lifetime::Resumed,
        };
        // The runtime's own quirks (sending a call twice) come from another stream.
        let mut harness_rng = SplitMix64::new(self.seed, 0x4a7e55 + salt);
        let mut log = AgentLog {
            lines: Vec::new(),
            answers: BTreeMap::new(),
        };
        let checkpoint = self.read_checkpoint(spec.name);
        let header = format!(
            "  agent {} (tenant {}, {} steps, keys tc1:{run}:<step>:<tool>)",
            spec.name,
            spec.tenant,
            plan.len()
        );
        log.lines.push(header);
        if lifetime == Lifetime::Resumed {
            // Resuming is safe rather than merely possible because the replayed steps carry
            // the same keys: those that finished replay their stored results, and the one
            // that died mid-call is taken over and reconciled.
            let reached = match spec.crash.how {
                Death::BetweenSteps => spec.crash.step - 1,
                _ => spec.crash.step,
            };
            log.lines.push(format!(
                "    resumes from its checkpoint after step {checkpoint}: steps {}..={reached} \
                 run again, with the same keys",
                checkpoint + 1,
            ));
        }
        for step in &plan[usize::try_from(checkpoint).expect("a step number")..] {
            let mut first = if harness_rng.chance(DUPLICATE) {
                FirstCall::Twice
            } else {
                FirstCall::Once
            };
            if lifetime == Lifetime::First && step.number == spec.crash.step {
                if spec.crash.how == Death::BetweenSteps {
                    log.lines.push(format!(
                        "    step {:>2} -- the process dies before this step starts",
                        step.number
                    ));
                    break;
                }
                first = FirstCall::DiesInside(spec.crash.how);
            }
            // The key: the run, the step and the tool, all of them the harness's. Not the
            // arguments, not anything the model wrote, so every retry of this step, however
            // it is worded, and its replay after a resume, lands on the same record.
            let key = ToolCallKey::new(run, step.number, step.tool.name());
            let end = self.run_step(gateway, spec, &key, step, &mut model, first)?;
            match end {
                StepEnd::Answered {
                    id,
                    trail,
                    reworded,
                } => {
                    log.lines.push(format!(
                        "    step {:>2} {:<15} {id:<10} {trail}",
                        step.number,
                        step.tool.name()
                    ));
                    if let Some((first, retry)) = reworded {
                        log.lines.push(format!("{:>18} first call   {first}", ""));
                        log.lines.push(format!("{:>18} model retry  {retry}", ""));
                    }
                    log.answers.insert(step.number, id);
                }
                StepEnd::Died { trail } => {
                    // The narrator may look at the server; the dead process could not.
                    let what = match self.server.find(&reference(spec.tenant, &key)) {
                        Some(body) => format!("the server had created {}", id_of(&body)),
                        None => "the server holds nothing for it".to_owned(),
                    };
                    log.lines.push(format!(
                        "    step {:>2} {:<15} {:<10} {trail}: the process dies here ({what})",
                        step.number,
                        step.tool.name(),
                        "--"
                    ));
                    break;
                }
            }
            if step.number % CHECKPOINT_EVERY == 0 {
                self.write_checkpoint(spec.name, step.number);
                log.lines
                    .push(format!("    checkpoint after step {}", step.number));
            }
        }
        Ok(log)
    }

    /// Drives one logical step to an answer: the first call, then whatever retries the model
    /// makes. All of them carry the same key.
    fn run_step(
        &self,
        gateway: &Gateway,
        spec: &AgentSpec,
        key: &ToolCallKey,
        step: &PlanStep,
        model: &mut Model,
        first: FirstCall,
    ) -> idemdb::Result<StepEnd> {
        let mut wording = model.first_wording(step);
        let mut trail: Vec<String> = Vec::new();
        let first_args = Model::arguments(step, wording);
        loop {
            let args = Model::arguments(step, wording);
            let (twice, death) = match first {
                _ if !trail.is_empty() => (false, None),
                FirstCall::Once => (false, None),
                FirstCall::Twice => (true, None),
                FirstCall::DiesInside(death) => (false, Some(death)),
            };
            let mut sent = if twice {
                // The runtime sends the call twice at once. The gateway runs the tool for one
                // of them; the other waits for its result.
                self.metrics.bump(&self.metrics.duplicates);
                thread::scope(|s| {
                    let other = s.spawn(|| self.send(gateway, spec, key, step.tool, &args, None));
                    let mine = self.send(gateway, spec, key, step.tool, &args, None);
                    Ok::<_, idemdb::Error>(vec![mine?, other.join().expect("duplicate call")?])
                })?
            } else {
                vec![self.send(gateway, spec, key, step.tool, &args, death)?]
            };
            // Copies sent at once all wait on the same server call: when it is too slow for
            // the harness, every copy times out, the one that waited for it included.
            if sent.iter().any(|s| s.slow) {
                for s in &mut sent {
                    if matches!(s.heard, Heard::Answer(_)) {
                        s.heard = Heard::Timeout;
                        s.note.push_str(", timed out waiting");
                    }
                }
            }
            let timeouts = sent
                .iter()
                .filter(|s| matches!(s.heard, Heard::Timeout))
                .count();
            self.metrics
                .timeouts
                .fetch_add(timeouts as u64, Ordering::Relaxed);
            let reworded = sent.iter().filter(|s| s.arguments_changed).count() as u64;
            let retry = !trail.is_empty();
            let counter = if !retry {
                // The first call of a step that already ran: a resumed model regenerated it.
                &self.metrics.reworded_on_resume
            } else {
                &self.metrics.reworded_retries
            };
            counter.fetch_add(reworded, Ordering::Relaxed);
            let mut notes: Vec<&str> = sent.iter().map(|s| s.note.as_str()).collect();
            notes.sort_unstable();
            trail.push(match notes.as_slice() {
                [one] => one.to_string(),
                many => format!("[{}]", many.join(" | ")),
            });
            if sent.iter().any(|s| matches!(s.heard, Heard::Died)) {
                return Ok(StepEnd::Died {
                    trail: trail.join(" -> "),
                });
            }
            if let Some(body) = sent.iter().find_map(|s| match &s.heard {
                Heard::Answer(body) => Some(body),
                _ => None,
            }) {
                return Ok(StepEnd::Answered {
                    id: id_of(body),
                    trail: trail.join(" -> "),
                    reworded: (retry && reworded > 0).then(|| (first_args, args.clone())),
                });
            }
            let busy = sent
                .iter()
                .filter_map(|s| match s.heard {
                    Heard::Busy(wait) => Some(wait),
                    _ => None,
                })
                .max();
            match busy {
                // A duplicate is running right now: retry the same call a little later.
                Some(wait) => thread::sleep(wait.min(MAX_BACKOFF)),
                // The model saw a timeout or an error. It calls the tool again at once, with
                // reworded arguments. The harness gives the retry the same key, which is what
                // makes it safe: the retry of a timeout lands on the stored result, and the
                // retry of a released 503 runs the tool.
                None => wording += 1,
            }
        }
    }

    /// One call through the gateway to the tool server.
    fn send(
        &self,
        gateway: &Gateway,
        spec: &AgentSpec,
        key: &ToolCallKey,
        tool: Tool,
        args: &str,
        death: Option<Death>,
    ) -> idemdb::Result<Sent> {
        let metrics = &self.metrics;
        metrics.bump(&metrics.calls);
        let mut ran = ToolRun::default();
        let call = panic::catch_unwind(AssertUnwindSafe(|| {
            gateway.call(spec.tenant, key, args.as_bytes(), |attempt| {
                let reference = reference(spec.tenant, key);
                self.run_tool(attempt, tool, args, &reference, death, &mut ran)
            })
        }));
        let outcome = match call {
            Ok(outcome) => outcome?,
            Err(payload) if payload.is::<ProcessKilled>() => {
                return Ok(Sent::new(Heard::Died, "claimed, tool running"));
            }
            Err(payload) => panic::resume_unwind(payload),
        };
        let sent = match outcome {
            Outcome::Executed { result, .. } => {
                let note = ran.reconciled.unwrap_or_else(|| "executed".to_owned());
                if ran.took > HARNESS_DEADLINE {
                    // The result is stored, but the harness gave up waiting for it.
                    let mut sent = Sent::new(
                        Heard::Timeout,
                        &format!("{note}, timed out ({}s)", ran.took.as_secs()),
                    );
                    sent.slow = true;
                    sent
                } else {
                    Sent::new(Heard::Answer(result.unwrap_or_else(|e| e)), &note)
                }
            }
            Outcome::Replayed {
                result,
                arguments_changed,
            } => {
                metrics.bump(&metrics.replays);
                let answer = Heard::Answer(result.unwrap_or_else(|e| e));
                if arguments_changed {
                    // The model reworded the call; the key did not change, so it collapsed onto
                    // the call that ran. Worth a log line: the stored result answers what the
                    // first wording asked.
                    let mut sent = Sent::new(answer, "replayed (arguments changed)");
                    sent.arguments_changed = true;
                    sent
                } else {
                    Sent::new(answer, "replayed")
                }
            }
            Outcome::Released { error } => {
                metrics.bump(&metrics.released);
                let reason = String::from_utf8_lossy(&error);
                let note = match ran.reconciled {
                    Some(reconciled) => format!("{reconciled}: {reason}, released"),
                    None => format!("{reason}, released"),
                };
                Sent::new(Heard::Error, &note)
            }
            Outcome::InProgress { retry_after } => {
                metrics.bump(&metrics.in_flight);
                Sent::new(Heard::Busy(retry_after), "in flight elsewhere")
            }
            // `Mismatch` comes only under `ArgumentPolicy::Strict`, which this gateway does not
            // use: it replays reworded calls. No tool here fails ambiguously (`Unresolved`).
            other => unreachable!("unexpected outcome {other:?}"),
        };
        Ok(sent)
    }

    /// What runs when the gateway lets the tool run: the request to the tool server, and the
    /// reconciliation first when the gateway says an earlier attempt was abandoned.
    fn run_tool(
        &self,
        attempt: &Attempt,
        tool: Tool,
        args: &str,
        reference: &str,
        death: Option<Death>,
        ran: &mut ToolRun,
    ) -> Result<Vec<u8>, Failure<Vec<u8>>> {
        if let Some(abandoned) = attempt.takeover() {
            // An earlier attempt of this very call claimed the key and never finished (here:
            // its process died). It may or may not have reached the server, so look the
            // effect up by its reference before creating a second one.
            self.metrics.bump(&self.metrics.takeovers);
            let whose = if abandoned.orphan {
                "a previous process's"
            } else {
                "a stale"
            };
            if let Some(body) = self.server.find(reference) {
                self.metrics.bump(&self.metrics.takeovers_found);
                ran.reconciled = Some(format!(
                    "took over {whose} claim; found {} on the server, returned it",
                    id_of(&body)
                ));
                return Ok(body);
            }
            ran.reconciled = Some(format!(
                "took over {whose} claim; nothing on the server, ran it"
            ));
        }
        if death == Some(Death::BeforeTheRequest) {
            panic::panic_any(ProcessKilled);
        }
        let reply = self.server.call(tool, reference, args.as_bytes());
        if death == Some(Death::AfterTheEffect) {
            panic::panic_any(ProcessKilled);
        }
        match reply {
            Ok(reply) => {
                ran.took = reply.took;
                Ok(reply.body)
            }
            // Nothing happened: a failure of the moment, so the key is released and the next
            // attempt runs the tool again. (A timeout from the server would NOT be transient:
            // the effect may have happened, and releasing the key would let the retry repeat
            // it. Here the gateway waits the server out; it is the harness that gives up.)
            Err(Unavailable) => Err(Failure::Transient(b"503".to_vec())),
        }
    }

    fn checkpoint_path(&self, agent: &str) -> PathBuf {
        self.checkpoints.join(format!("{agent}.checkpoint"))
    }

    /// The last checkpointed step, 0 if none.
    fn read_checkpoint(&self, agent: &str) -> u64 {
        std::fs::read_to_string(self.checkpoint_path(agent))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    fn write_checkpoint(&self, agent: &str, step: u64) {
        std::fs::write(self.checkpoint_path(agent), step.to_string()).expect("write checkpoint");
    }

    /// Everything that must hold at the end; each violation, described.
    fn verify(&self, first: &[AgentLog], second: &[AgentLog], in_flight: usize) -> Vec<String> {
        let mut problems = Vec::new();
        for (i, spec) in AGENTS.iter().enumerate() {
            let (before, after) = (&first[i].answers, &second[i].answers);
            for step in &self.plans[i] {
                let key = ToolCallKey::new(&self.runs[i], step.number, step.tool.name());
                let effects = self.server.effects(&reference(spec.tenant, &key));
                let [(tool, id)] = effects.as_slice() else {
                    problems.push(format!(
                        "{} step {}: {} side effects on the server: {effects:?}",
                        spec.name,
                        step.number,
                        effects.len()
                    ));
                    continue;
                };
                if *tool != step.tool {
                    problems.push(format!(
                        "{} step {}: the server ran {tool:?} for a {:?} step",
                        spec.name, step.number, step.tool
                    ));
                }
                // The agent heard the id of the effect that exists, in each lifetime that ran
                // the step.
                let heard: Vec<&String> = [before, after]
                    .iter()
                    .filter_map(|answers| answers.get(&step.number))
                    .collect();
                if heard.is_empty() || heard.iter().any(|h| *h != id) {
                    problems.push(format!(
                        "{} step {}: the server holds {id}, the transcript says {heard:?}",
                        spec.name, step.number
                    ));
                }
            }
        }
        let steps: usize = self.plans.iter().map(Vec::len).sum();
        let (incidents, pages) = self.server.totals();
        if incidents + pages != steps {
            problems.push(format!(
                "{incidents} incidents + {pages} pages for {steps} logical steps"
            ));
        }
        let takeovers = self.metrics.get(&self.metrics.takeovers);
        if takeovers != in_flight as u64 {
            problems.push(format!(
                "{in_flight} calls died in flight, but {takeovers} were taken over"
            ));
        }
        problems
    }

    fn report(&self, steps: usize, stats: [Stats; 2]) {
        let m = &self.metrics;
        let get = |c: &AtomicU64| m.get(c);
        let (incidents, pages) = self.server.totals();
        let [a, b] = stats;
        println!("\nreport");
        println!("  logical steps                  {steps}");
        println!(
            "  tool calls attempted           {} (incl. {} concurrent duplicates)",
            get(&m.calls),
            get(&m.duplicates)
        );
        println!(
            "  tool server calls              {} ({} answered 503)",
            self.server.calls(),
            get(&m.released)
        );
        println!(
            "  side effects performed         {} ({incidents} incidents, {pages} pages)",
            incidents + pages
        );
        println!("  replays (stored result)        {}", get(&m.replays));
        println!(
            "  reworded retries detected      {} (+ {} reworded replays of resumed steps)",
            get(&m.reworded_retries),
            get(&m.reworded_on_resume)
        );
        println!("  timeouts seen by the harness   {}", get(&m.timeouts));
        println!("  transient failures released    {}", get(&m.released));
        println!(
            "  takeovers reconciled           {} ({} found on the server, {} run afresh)",
            get(&m.takeovers),
            get(&m.takeovers_found),
            get(&m.takeovers) - get(&m.takeovers_found)
        );
        println!(
            "  in flight (busy) answers       {} (duplicates wait for the running call)",
            get(&m.in_flight)
        );
        println!(
            "  store: acquired {}, completed {}, released {}, replayed {}, taken over {}",
            a.acquired + b.acquired,
            a.completes + b.completes,
            a.releases + b.releases,
            a.replays + b.replays,
            a.takeovers + b.takeovers
        );
    }
}

fn print_logs(logs: &[AgentLog]) {
    for log in logs {
        for line in &log.lines {
            println!("{line}");
        }
    }
}

/// The simulated crash: a panic carrying this, thrown inside a tool call and caught by the
/// harness, so the gateway never completes or releases the claim, exactly as if the process
/// had died there.
struct ProcessKilled;

/// Keeps the default panic message for real panics, and quiet for the simulated crash.
fn silence_simulated_crashes() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if !info.payload().is::<ProcessKilled>() {
            default(info);
        }
    }));
}

// ---------------------------------------------------------------------------------------------
// The incident tool server: another process. Its tools are imperative: every call that gets
// through creates something. It keeps the caller's reference with what it creates, so it can
// be asked "did this happen?", but it does not dedupe on it.

struct ToolServer {
    seed: u64,
    state: Mutex<ServerState>,
}

#[derive(Default)]
struct ServerState {
    incidents: Vec<Created>,
    pages: Vec<Created>,
    /// Calls per reference: fault draws depend on (seed, reference, call number), not on which
    /// thread got there first.
    calls: HashMap<String, u64>,
}

#[derive(Debug)]
struct Created {
    id: String,
    reference: String,
    body: Vec<u8>,
}

struct Reply {
    body: Vec<u8>,
    took: Duration,
}

struct Unavailable;

/// The dedupe reference the gateway passes down: tenant and tool-call key.
fn reference(tenant: &str, key: &ToolCallKey) -> String {
    format!("{tenant}/{key}")
}

impl ToolServer {
    fn new(seed: u64) -> ToolServer {
        ToolServer {
            seed,
            state: Mutex::default(),
        }
    }

    fn call(&self, tool: Tool, reference: &str, _args: &[u8]) -> Result<Reply, Unavailable> {
        let mut state = self.state.lock().unwrap();
        let calls = state.calls.entry(reference.to_owned()).or_default();
        *calls += 1;
        let draw = mix(self.seed ^ fnv1a(reference) ^ calls.wrapping_mul(0x2545_F491_4F6C_DD1D));
        let roll = draw % 1000;
        if roll < UNAVAILABLE {
            return Err(Unavailable);
        }
        let (prefix, list) = match tool {
            Tool::CreateIncident => ("INC", &mut state.incidents),
            Tool::PageOncall => ("PAGE", &mut state.pages),
        };
        let id = format!("{prefix}-{:05X}", (draw >> 24) & 0xF_FFFF);
        let body = format!(r#"{{"id":"{id}","status":"open"}}"#).into_bytes();
        list.push(Created {
            id,
            reference: reference.to_owned(),
            body: body.clone(),
        });
        let took = if roll < UNAVAILABLE + SLOW {
            SERVER_SLOW
        } else {
            SERVER_LATENCY
        };
        Ok(Reply { body, took })
    }

    /// The reconciliation query: what was created under this reference, if anything?
    fn find(&self, reference: &str) -> Option<Vec<u8>> {
        let state = self.state.lock().unwrap();
        let all = state.incidents.iter().chain(&state.pages);
        all.into_iter()
            .find(|c| c.reference == reference)
            .map(|c| c.body.clone())
    }

    /// Every side effect under this reference.
    fn effects(&self, reference: &str) -> Vec<(Tool, String)> {
        let state = self.state.lock().unwrap();
        let incidents = state.incidents.iter().map(|c| (Tool::CreateIncident, c));
        let pages = state.pages.iter().map(|c| (Tool::PageOncall, c));
        incidents
            .chain(pages)
            .filter(|(_, c)| c.reference == reference)
            .map(|(tool, c)| (tool, c.id.clone()))
            .collect()
    }

    /// `(incidents, pages)` created.
    fn totals(&self) -> (usize, usize) {
        let state = self.state.lock().unwrap();
        (state.incidents.len(), state.pages.len())
    }

    fn calls(&self) -> u64 {
        self.state.lock().unwrap().calls.values().sum()
    }
}

/// The `"id"` of a tool result.
fn id_of(body: &[u8]) -> String {
    let body = String::from_utf8_lossy(body);
    body.split_once(r#""id":""#)
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or_else(|| body.to_string(), |(id, _)| id.to_owned())
}

// ---------------------------------------------------------------------------------------------
// Counting, and the PRNG.

#[derive(Default)]
struct Metrics {
    calls: AtomicU64,
    duplicates: AtomicU64,
    replays: AtomicU64,
    reworded_retries: AtomicU64,
    reworded_on_resume: AtomicU64,
    timeouts: AtomicU64,
    released: AtomicU64,
    in_flight: AtomicU64,
    takeovers: AtomicU64,
    takeovers_found: AtomicU64,
}

impl Metrics {
    fn bump(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self, counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// splitmix64: small, fast, and plenty for drawing faults.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64, stream: u64) -> SplitMix64 {
        SplitMix64(seed ^ mix(stream))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        let i = self.below(items.len() as u64);
        items[usize::try_from(i).expect("an index")]
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
