//! `toolgate`: the command-line host. Parses arguments (clap) and calls the
//! library; all decisions live there. Data goes to stdout, diagnostics to
//! stderr as `toolgate: <cause chain>` plus a `hint:` where there is a fix.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use serde_json::json;
use toolgate::runtime::StepResult;
use toolgate::store::StepStore;
use toolgate::{Catalog, Config, ExecutableAgentSnapshot, Runtime, ToolCapabilityNarrowing};

mod approve;
mod log;
mod serve;

/// mimalloc, not the system allocator: compiling a component allocates per
/// instruction, and with glibc's malloc a first call (compiled by Winch then)
/// took ~40% longer (BENCHMARKS.md, issue #17). A host embedding the library
/// chooses its own.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit codes: callers (scripts, CI) tell outcomes apart without parsing text.
mod exit {
    pub const OUTPUT: u8 = 0;
    pub const HOST_ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const CONFIG: u8 = 3;
    pub const TOOL_ERROR: u8 = 10;
    pub const BLOCKED: u8 = 11;
    pub const AWAITING: u8 = 12;
    pub const CANCELLED: u8 = 13;
}

#[derive(Parser)]
#[command(name = "toolgate", version, about = "A WebAssembly plugin host for AI-agent Tools")]
struct Cli {
    /// Config file (or `TOOLGATE_CONFIG`).
    #[arg(long, short, global = true, env = "TOOLGATE_CONFIG", default_value = "toolgate.toml")]
    config: PathBuf,
    /// Agent whose view and policy apply.
    #[arg(long, global = true, default_value = "default")]
    agent: String,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a Tool project NAME: one working Tool with a test, the SDK
    /// dependency, and a toolgate.toml for local development.
    New {
        /// The project and Tool id prefix (lowercase letters, digits, `_`).
        name: String,
        /// The Tool's language: `rust` or `python`.
        #[arg(long, default_value = "rust")]
        lang: String,
        /// The toolgate SDK (`guest-sdk`, or `guest-sdk/python` for Python,
        /// of a toolgate checkout); default: from TOOLGATE_SDK, else the
        /// checkout this binary was built from.
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Build the project in this directory into a component (cargo, or
    /// componentize-py in the project's .venv) and pack it into its plugin directory.
    Build,
    /// Embed a built component's descriptors in its metadata section.
    Pack {
        /// The component built by `cargo build --target wasm32-wasip2`.
        input: PathBuf,
        /// Where to write the shippable component.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Show a component's descriptors, declared capabilities and digest (nothing runs).
    Inspect {
        /// The component file.
        file: PathBuf,
    },
    /// List the tools the agent sees.
    List {
        /// Also list hidden, ambiguous, ungranted tools and refused files, with reasons.
        #[arg(long)]
        all: bool,
    },
    /// Call a tool through the whole path: filter, gate, sandbox, commit.
    Call {
        /// Tool id.
        tool: String,
        /// Arguments as a JSON object: the text itself, `@PATH` to read it from
        /// a file, or `-` to read it from stdin (at most `limits.arguments_kib`).
        #[arg(long, default_value = "{}")]
        args: String,
        /// Continue this run instead of starting a new one.
        #[arg(long)]
        run: Option<String>,
        /// Start the run with tools disabled (every call is blocked).
        #[arg(long)]
        no_tools: bool,
        /// If the call awaits approval, wait until an approver decides (or the
        /// request expires), then print the decided result. Ctrl-C or SIGTERM
        /// stops waiting: exit 12, the request still pending.
        #[arg(long)]
        wait: bool,
        /// With `--wait`: stop waiting after this many seconds (exit 12, the
        /// request still pending).
        #[arg(long, value_name = "SECS", requires = "wait")]
        wait_timeout: Option<u64>,
    },
    /// Approve a ticket as an approver: execute exactly the stored call, once.
    /// With `[approval] keys`, sign with `--key`; without, confirm on a terminal.
    Approve {
        /// Ticket id (from `toolgate journal --awaiting`, shown to approvers).
        ticket: String,
        /// An approver's secret key (its public key listed in `[approval] keys`).
        #[arg(long)]
        key: Option<PathBuf>,
        /// The call digest `toolgate journal --awaiting` listed for the request
        /// (all 64 hex characters): the approval is refused if the stored call
        /// is no longer that one. Needed with `--key` off a terminal.
        #[arg(long)]
        digest: Option<String>,
    },
    /// Deny a ticket as an approver: commit a blocked result the model reads.
    Deny {
        /// Ticket id.
        ticket: String,
        /// Why (the model reads it).
        #[arg(long, default_value = "denied by operator")]
        reason: String,
        /// An approver's secret key (its public key listed in `[approval] keys`).
        #[arg(long)]
        key: Option<PathBuf>,
    },
    /// Agent Skills: pack a Skill folder into a Tool component.
    Skill {
        #[command(subcommand)]
        command: SkillCommand,
    },
    /// MCP adapters: import a remote MCP server's tools as a pinned Tool component.
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
    /// Make an ed25519 key pair: writes the secret key (mode 0600), prints the config entry that trusts it.
    Keygen {
        /// Where to write the secret key.
        #[arg(short, long)]
        output: PathBuf,
        /// What the key is for: `signing` (a publisher's components) or `approval` (an approver's decisions).
        #[arg(long = "for", default_value = "signing", value_parser = ["signing", "approval"])]
        purpose: String,
    },
    /// Sign a component with a secret key from `toolgate keygen`: writes FILE.sig next to it.
    Sign {
        /// The component file.
        file: PathBuf,
        /// The secret key file.
        #[arg(long)]
        key: PathBuf,
    },
    /// Pin the digest of every loadable plugin in toolgate.lock; with a lock, nothing else loads.
    Lock,
    /// Serve the agent's tools to MCP clients (the same gate, sandbox and journal): over stdio, or with
    /// `--http ADDR` over Streamable HTTP, where each bearer token of `[[serve.auth]]` is bound to its agent.
    Serve {
        /// Listen on this address (e.g. `127.0.0.1:8080`) for Streamable HTTP instead of stdio.
        #[arg(long)]
        http: Option<std::net::SocketAddr>,
    },
    /// Show the journal.
    Journal {
        /// Only this run.
        #[arg(long)]
        run: Option<String>,
        /// Show pending approval requests instead of steps (tickets only to an approver).
        #[arg(long)]
        awaiting: bool,
        /// With `--awaiting`: an approver key (listed in `[approval] keys`), to see tickets.
        #[arg(long)]
        key: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum SkillCommand {
    /// Pack DIR (SKILL.md + references/ + assets/) into a component, with the generic Skill adapter that
    /// ships with toolgate (no toolchain needed). Only the folder's own files: a symlink or special file
    /// in it is refused, and so is content holding a configured secret.
    Pack {
        /// The Skill folder.
        dir: PathBuf,
        /// Where to write the component.
        #[arg(short, long)]
        output: PathBuf,
    },
}

#[derive(Subcommand)]
enum McpCommand {
    /// Ask the MCP server at URL (streamable HTTP) for its tools once and write a component that pins them
    /// (ids `mcp__<NAME>__<tool>`); calls go through the host's outbound boundary and are refused if the
    /// remote definition changes. Writes data into the adapter shipped in toolgate: no toolchain needed.
    Import {
        /// The server's MCP endpoint, e.g. `https://mcp.example.com/mcp`.
        url: String,
        /// Credential (a `[credentials.NAME]` of the config) the host applies to every request.
        #[arg(long)]
        credential: Option<String>,
        /// Name for the Tool ids `mcp__<NAME>__<tool>`: yours, since grants and rules match those ids (the
        /// server's own `serverInfo.name` is never taken for it). Letters, digits, `-`, `.`, and single `_`
        /// between them (other characters become `_`): no `__`, so no name reaches into another's ids.
        #[arg(long)]
        name: String,
        /// Within one remote session, compare the remote tool with the pin again once the last check is this
        /// many seconds old; 0 checks before every call (one more request each). Every new session is checked.
        #[arg(long, value_name = "SECS", default_value_t = toolgate_sdk::mcp::DEFAULT_VERIFY_EVERY_SECS)]
        verify_every: u64,
        /// Give up when the server has not listed its tools within this many seconds (connecting and every
        /// page included).
        #[arg(
            long,
            value_name = "SECS",
            default_value_t = toolgate_author::mcp_import::DEFAULT_TIMEOUT_SECS,
            value_parser = clap::value_parser!(u64).range(1..=86_400)
        )]
        timeout: u64,
        /// Where to write the component.
        #[arg(short, long)]
        output: PathBuf,
    },
}

fn main() -> ExitCode {
    // Warnings (refused plugin files, settled tickets) show by default;
    // `TOOLGATE_LOG` overrides. Plain text when stderr is not a terminal.
    let mut filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .with_env_var("TOOLGATE_LOG")
        .from_env_lossy();
    // rmcp logs a failed request with its URL, which for `mcp import` holds
    // a query credential: off whatever `TOOLGATE_LOG` says (a filter set for
    // CI must not turn it on); toolgate reports the failure itself, checked.
    if let Ok(quiet) = "rmcp::transport::streamable_http_client=off".parse() {
        filter = filter.add_directive(quiet);
    }
    // Every record through one sink that escapes what it holds and withholds
    // a configured secret (`log`); no colors, as their escapes would be escaped.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(log::Sink)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .init();
    // A guest's open files are the host's descriptors: as many as the OS allows.
    if let Err(e) = toolgate::host::raise_open_file_limit() {
        tracing::warn!("cannot raise the open-file limit to its hard limit: {e}");
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("toolgate: {}", safe(&format!("{e:#}")));
            let code = if let Some(c) = e.downcast_ref::<toolgate::config::ConfigError>() {
                eprintln!("hint: {}", config_hint(c));
                exit::CONFIG
            } else if missing_plugins(&e) {
                eprintln!(
                    "hint: create the directory, or point `plugins` in the config at the one holding the plugins"
                );
                exit::CONFIG
            } else if e.downcast_ref::<Usage>().is_some()
                || e.downcast_ref::<toolgate::runtime::CallError>()
                    .is_some_and(|c| matches!(c, toolgate::runtime::CallError::UnknownTool(_)))
            {
                exit::USAGE
            } else {
                exit::HOST_ERROR
            };
            ExitCode::from(code)
        }
    }
}

/// A command line that cannot be acted on as given (exit code 2), with what to pass instead.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// The longest `--run` id, bytes (the host's own are 36).
const MAX_RUN_ID: usize = 128;

/// Refuse a `--run` id no run of this host could have: too long, or with
/// characters other than letters, digits, `-`, `_`, `.` and `:`.
fn check_run_id(id: &str) -> Result<(), Usage> {
    let shown: String = id.chars().take(40).collect::<String>().escape_debug().to_string();
    if id.is_empty() || id.len() > MAX_RUN_ID {
        return Err(Usage(format!(
            "--run \"{shown}{}\": a run id is 1 to {MAX_RUN_ID} characters; pass the id a call printed \
             (`run-…`), or leave out --run to start a run",
            if id.chars().count() > 40 { "…" } else { "" }
        )));
    }
    if !id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')) {
        return Err(Usage(format!(
            "--run \"{shown}\": a run id holds only letters, digits, `-`, `_`, `.` and `:`; pass the id a call \
             printed (`run-…`), or leave out --run to start a run"
        )));
    }
    Ok(())
}

/// Whether `e` is a plugin directory that is not there (or not a directory):
/// the config names it, so it is a configuration error (exit 3).
fn missing_plugins(e: &anyhow::Error) -> bool {
    use toolgate::catalog::CatalogError;
    let catalog = e.downcast_ref::<CatalogError>().or_else(|| match e.downcast_ref::<toolgate::host::HostError>() {
        Some(toolgate::host::HostError::Catalog(c)) => Some(c),
        _ => None,
    });
    matches!(
        catalog,
        Some(CatalogError::Directory { source, .. })
            if matches!(source.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory)
    )
}

fn config_hint(e: &toolgate::config::ConfigError) -> &'static str {
    match e {
        toolgate::config::ConfigError::Read { .. } => {
            "run from the directory holding toolgate.toml or pass --config FILE"
        }
        _ => "see the config reference in README.md",
    }
}

/// Parse nothing more, decide nothing: start the async runtime and dispatch.
fn run(cli: Cli) -> Result<u8> {
    let rt =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    let result = rt.block_on(dispatch(cli));
    // Exit now: never wait for a blocking thread a guest's call left behind.
    rt.shutdown_background();
    result
}

struct Host {
    config: Config,
    runtime: Runtime,
}

/// The config at `path`; from now on what is logged is checked for every
/// secret it names (`log`).
fn load_config(path: &Path) -> Result<Config, toolgate::config::ConfigError> {
    let config = Config::load(path)?;
    log::watch(&config);
    Ok(config)
}

async fn open_host(cli: &Cli) -> Result<Host> {
    open_host_with(load_config(&cli.config)?, &cli.agent).await
}

async fn open_host_with(config: Config, agent: &str) -> Result<Host> {
    let runtime = toolgate::host::open(&config, agent).await?;
    report_refused(runtime.snapshot().catalog());
    Ok(Host { config, runtime })
}

fn report_refused(catalog: &Catalog) {
    for r in catalog.refused() {
        tracing::warn!("refused plugin {}: {}", field(&r.path.display().to_string()), field(&r.reason));
    }
}

async fn dispatch(cli: Cli) -> Result<u8> {
    match &cli.command {
        Command::Pack { input, output } => pack(input, output).await,
        Command::New { name, lang, sdk } => {
            use toolgate_author::scaffold::{self, Lang};
            let lang: Lang = lang.parse().map_err(anyhow::Error::msg)?;
            let sdk = sdk.clone().unwrap_or_else(|| scaffold::default_sdk(lang));
            let hint = if lang == Lang::Rust { "guest-sdk" } else { "guest-sdk/python" };
            let sdk = std::fs::canonicalize(&sdk)
                .with_context(|| format!("the toolgate SDK is not at {}; pass --sdk PATH/TO/{hint}", sdk.display()))?;
            let root = scaffold::new(Path::new("."), name, lang, &sdk)?;
            eprintln!("created {} (SDK {})", root.display(), sdk.display());
            eprintln!(
                "next: cd {name} && toolgate build && toolgate call {name}.hello --args '{{\"name\":\"world\"}}'"
            );
            Ok(exit::OUTPUT)
        }
        Command::Build => {
            let (name, bytes) = toolgate_author::scaffold::build(Path::new("."))?;
            let config = load_config(&cli.config)?;
            std::fs::create_dir_all(&config.plugins)
                .with_context(|| format!("cannot create {}", config.plugins.display()))?;
            let output = config.plugins.join(format!("{name}.wasm"));
            let (packed, tools) = toolgate_author::pack::pack(&bytes).await.with_context(|| name.clone())?;
            std::fs::write(&output, &packed).with_context(|| format!("cannot write {}", output.display()))?;
            eprintln!("packed {} tool(s) into {} ({})", tools.len(), output.display(), toolgate::Digest::of(&packed));
            for t in tools {
                println!("{}", t.id());
            }
            Ok(exit::OUTPUT)
        }
        Command::Inspect { file } => inspect(file, cli.json),
        Command::List { all } => {
            // Listing reads metadata only: no engine, no journal.
            let config = load_config(&cli.config)?;
            let catalog = Arc::new(toolgate::host::catalog(&config)?);
            let snapshot = ExecutableAgentSnapshot::build(&config, &cli.agent, catalog)?;
            list(&config, &snapshot, *all, cli.json)
        }
        Command::Call { tool, args, run, no_tools, wait, wait_timeout } => {
            // What the command line alone decides is checked before the host
            // (and its journal) is opened.
            if let Some(id) = run.as_deref() {
                check_run_id(id)?;
            }
            let config = load_config(&cli.config)?;
            let arguments = call_arguments(args, &config)?;
            let host = open_host_with(config, &cli.agent).await?;
            let narrowing =
                if *no_tools { ToolCapabilityNarrowing::DenyAll } else { ToolCapabilityNarrowing::Configured };
            if let Some(id) = run.as_deref().filter(|id| id.starts_with(toolgate::store::STATELESS_RUN_PREFIX)) {
                // Its asks are what stateless requests find; a conversation never continues it.
                anyhow::bail!(
                    "--run {id}: a run named `{}…` serves one stateless MCP request and is not continued; \
                     pass the id of a run `toolgate call` started (`run-…`), or none for a new run",
                    toolgate::store::STATELESS_RUN_PREFIX
                );
            }
            if let Some(id) = run.as_deref()
                && host.runtime.store().run(id).await?.is_none()
            {
                // Continuing is for a run the journal holds: any other id
                // would start an unrecorded run under a name the caller chose.
                let journal = host.config.store.file().map(|f| format!(" ({})", f.display())).unwrap_or_default();
                return Err(Usage(format!(
                    "--run {id}: no run `{id}` in the journal{journal}; leave out --run to start one, or pass \
                     the id a call printed (`run-…`)"
                ))
                .into());
            }
            let run = host.runtime.start_run(run.clone(), narrowing).await?;
            // Ctrl-C withdraws the call: the guest stops and the step is journaled as cancelled.
            let interrupted = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            let mut result = run.call_until(tool, arguments.clone(), interrupted).await?;
            if let (true, StepResult::Awaiting { ticket, expires_at, correlation, .. }) = (*wait, &result) {
                let timeout = wait_timeout.map(std::time::Duration::from_secs);
                match wait_for_decision(&host.runtime, ticket, *expires_at, correlation, timeout).await? {
                    // The identical call in the same run receives the decided result, once.
                    Waited::Decided => result = run.call(tool, arguments).await?,
                    Waited::Stopped(why) => {
                        eprintln!(
                            "toolgate: stopped waiting ({why}); request {} is still pending: once an approver \
                             decided it, make the same call with `--run {}`",
                            field(correlation),
                            run.id()
                        );
                    }
                }
            }
            Ok(report(&result, Some(run.id()), cli.json))
        }
        Command::Approve { ticket, key, digest } => {
            let host = open_host(&cli).await?;
            let decision = toolgate::approval::Decision::Approve;
            let result =
                approve::decide(&host.config, &host.runtime, ticket, key.as_deref(), digest.as_deref(), decision)
                    .await?;
            Ok(report(&result, None, cli.json))
        }
        Command::Deny { ticket, reason, key } => {
            let host = open_host(&cli).await?;
            let decision = toolgate::approval::Decision::Deny { reason: reason.clone() };
            let result = approve::decide(&host.config, &host.runtime, ticket, key.as_deref(), None, decision).await?;
            Ok(report(&result, None, cli.json))
        }
        Command::Skill { command: SkillCommand::Pack { dir, output } } => {
            let skill = toolgate_author::skill::read(dir)?;
            // The operator's config, when there is one: what the Skill packs
            // is checked against every configured credential's secret.
            let (_, secrets) = configured_secrets(&cli.config, false, "the Skill's files")?;
            skill.refuse_secrets(dir, &secrets)?;
            let (packed, tools) = toolgate_author::skill::pack(&skill).await?;
            std::fs::write(output, &packed).with_context(|| format!("cannot write {}", output.display()))?;
            eprintln!("packed {} into {} ({})", skill.tool_id(), output.display(), toolgate::Digest::of(&packed));
            for t in tools {
                println!("{}", t.id());
            }
            Ok(exit::OUTPUT)
        }
        Command::Mcp { command: McpCommand::Import { url, credential, name, verify_every, timeout, output } } => {
            let timeout = std::time::Duration::from_secs(*timeout);
            mcp_import(&cli.config, url, credential.as_deref(), Some(name.as_str()), *verify_every, timeout, output)
                .await
        }
        Command::Keygen { output, purpose } => {
            let (secret, public) = toolgate::keys::keygen().map_err(anyhow::Error::msg)?;
            write_private(output, &secret)?;
            eprintln!("wrote the secret key to {}; trust it with:", output.display());
            println!("[{purpose}]\nkeys = [\"{public}\"]");
            Ok(exit::OUTPUT)
        }
        Command::Sign { file, key } => {
            // A regular file, bounded: a FIFO or `/dev/zero` is refused, not waited on or read without end.
            let bytes = toolgate::catalog::read_bounded(file)
                .map_err(|e| anyhow::anyhow!("{}: {e}; sign the component file itself", file.display()))?;
            let secret =
                toolgate::files::read_text(key, 4096).with_context(|| format!("cannot read {}", key.display()))?;
            let (sig, public) = toolgate::catalog::signing::sign(&bytes, &secret)
                .map_err(|e| anyhow::anyhow!("{}: {e}", key.display()))?;
            let out = toolgate::catalog::signing::sig_path(file);
            std::fs::write(&out, sig).with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!("signed {} ({}) with {public}", file.display(), toolgate::Digest::of(&bytes));
            println!("{}", out.display());
            Ok(exit::OUTPUT)
        }
        Command::Lock => {
            let config = load_config(&cli.config)?;
            // Read without the old lock: the operator is accepting what is there now
            // (never a component a Tool could have changed).
            let writable = config.writable();
            let catalog =
                Catalog::load_guarded(&config.plugins, None, &Default::default(), &|p| writable.check_component(p))?;
            let mut pinned = std::collections::BTreeMap::new();
            for c in catalog.components() {
                let name = c.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                println!("{}  {}", field(&name), c.digest);
                pinned.insert(name, c.digest);
            }
            let refused = catalog.refused().len();
            for r in catalog.refused() {
                eprintln!("toolgate: not pinned: {}: {}", field(&r.path.display().to_string()), field(&r.reason));
            }
            // What loaded is pinned even when a file was refused (a file the
            // lock does not name never loads under it); the exit code says
            // the plugin directory is not what the operator meant to pin.
            toolgate::catalog::lockfile::Lockfile::write(&config.lock, &pinned)?;
            eprintln!("pinned {} plugin(s) in {}", pinned.len(), config.lock.display());
            // Pinning is the operator's trust decision: compile what was pinned
            // now, so no first call waits for the compiler.
            let (mut compiled, mut failed) = (0, 0);
            for (path, r) in toolgate::host::precompile(&config, &catalog).await? {
                match r {
                    Ok(now) => compiled += usize::from(now),
                    Err(e) => {
                        failed += 1;
                        eprintln!("toolgate: {}: not compiled: {}", field(&path.display().to_string()), field(&e))
                    }
                }
            }
            eprintln!("compiled {compiled} into {} (the rest were cached)", config.cache.display());
            if refused + failed > 0 {
                eprintln!(
                    "toolgate: {refused} plugin file(s) refused (not pinned) and {failed} not compiled: fix or remove \
                     them and run `toolgate lock` again"
                );
                return Ok(exit::HOST_ERROR);
            }
            Ok(exit::OUTPUT)
        }
        Command::Serve { http } => {
            let config = load_config(&cli.config)?;
            let settings = serve::ServeSettings::new(std::time::Duration::from_millis(config.serve.grace_ms));
            match http {
                None => {
                    let host = open_host(&cli).await?;
                    let server = serve::McpServer::new(host.config, Some(&cli.agent), host.runtime, settings)?;
                    server.serve_stdio().await?;
                }
                Some(addr) => {
                    // Agents come from the tokens; the first bound one opens the host.
                    let first = config.serve.auth.first().map(|a| a.agent.clone()).ok_or_else(|| {
                        anyhow::anyhow!(
                            "serving over HTTP needs authentication: add a `[[serve.auth]]` entry binding a token (by reference) to an agent"
                        )
                    })?;
                    let runtime = toolgate::host::open(&config, &first).await?;
                    report_refused(runtime.snapshot().catalog());
                    let server = serve::McpServer::new(config, None, runtime, settings)?;
                    serve::http::serve(server, *addr).await?;
                }
            }
            Ok(exit::OUTPUT)
        }
        Command::Journal { run, awaiting: true, key } => {
            if run.is_some() {
                anyhow::bail!(
                    "`--run` and `--awaiting` do not go together; list pending requests with `--awaiting` alone"
                );
            }
            // A listing: the journal opened as `journal` opens it, no host started.
            let config = load_config(&cli.config)?;
            let store = journal_to_list(&config).await?;
            let secrets = Withhold::configured(&config);
            approve::list_pending(&config, store.as_ref(), key.as_deref(), &secrets, cli.json).await?;
            Ok(exit::OUTPUT)
        }
        Command::Journal { run, awaiting: false, .. } => {
            let config = load_config(&cli.config)?;
            let store = journal_to_list(&config).await?;
            let secrets = Withhold::configured(&config);
            journal(store.as_ref(), run.as_deref(), &secrets, cli.json).await
        }
    }
}

/// The journal of `config`, to list: listing changes nothing, so an SQLite
/// journal is opened read-only (never created, migrated or switched to WAL).
async fn journal_to_list(config: &Config) -> Result<Arc<dyn StepStore>> {
    Ok(match &config.store {
        toolgate::config::StoreLocation::Sqlite(path) => {
            if !path.exists() {
                anyhow::bail!(
                    "no journal at {}: nothing has been journaled with this config (a `toolgate call` or `toolgate \
                     serve` writes it); pass the config of the host whose journal to show with --config FILE",
                    path.display()
                );
            }
            Arc::new(toolgate::SqliteJournal::open_read_only(path)?)
        }
        _ => toolgate::host::store(config).await?,
    })
}

/// How waiting for an approver ended.
enum Waited {
    /// The request was decided.
    Decided,
    /// Waiting stopped (why) with the request still pending.
    Stopped(&'static str),
}

/// Poll until an approver decided `ticket` (or it expired); stop on Ctrl-C,
/// SIGTERM or when `timeout` runs out.
async fn wait_for_decision(
    runtime: &Runtime,
    ticket: &str,
    expires_at: i64,
    correlation: &str,
    timeout: Option<std::time::Duration>,
) -> Result<Waited> {
    // Listening before the first poll: tokio's Ctrl-C handler, installed for
    // the call, keeps SIGINT from ending the process, so it is answered here.
    let mut interrupt = std::pin::pin!(tokio::signal::ctrl_c());
    #[cfg(unix)]
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let terminated = async {
        #[cfg(unix)]
        terminate.recv().await;
        #[cfg(not(unix))]
        std::future::pending::<()>().await;
    };
    let mut terminated = std::pin::pin!(terminated);
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let ran_out = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    let mut ran_out = std::pin::pin!(ran_out);
    eprintln!("toolgate: waiting for an approver to decide request {}", field(correlation));
    loop {
        let state = runtime.store().awaiting(ticket).await?.map(|r| r.state);
        if state.as_deref() == Some("resolved") {
            return Ok(Waited::Decided);
        }
        if toolgate::store::now() >= expires_at {
            anyhow::bail!("request {correlation} expired before an approver decided it; make the call again");
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
            _ = &mut interrupt => return Ok(Waited::Stopped("interrupted")),
            _ = &mut terminated => return Ok(Waited::Stopped("terminated")),
            _ = &mut ran_out => return Ok(Waited::Stopped("--wait-timeout ran out")),
        }
    }
}

/// `--args`: the JSON text itself, `@PATH` (a regular file) or `-` (stdin,
/// read only then), at most `limits.arguments_kib` read; parsed here, before
/// the host or its journal is opened. An error says where the text came
/// from, its length and where it stops being JSON, never the text (it may
/// hold a secret).
fn call_arguments(args: &str, config: &Config) -> Result<serde_json::Value> {
    use std::io::Read as _;
    let kib = config.limits.arguments_kib;
    let max = kib.saturating_mul(1024);
    let over = |from: &str| {
        Usage(format!(
            "--args {from}: more than `limits.arguments_kib` ({kib} KiB) of arguments; pass fewer, or raise \
             `[limits] arguments_kib` in the config"
        ))
    };
    let not_text = |from: &str| Usage(format!("--args {from}: the arguments are not UTF-8 text"));
    let (from, text) = if args == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .take(max.saturating_add(1))
            .read_to_end(&mut bytes)
            .context("--args -: cannot read stdin")?;
        if bytes.len() as u64 > max {
            return Err(over("-").into());
        }
        ("-".to_owned(), String::from_utf8(bytes).map_err(|_| not_text("-"))?)
    } else if let Some(path) = args.strip_prefix('@') {
        let from = format!("@{}", field(path));
        let bytes = toolgate::files::read_bounded(Path::new(path), max).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => over(&from),
            _ => Usage(format!("--args {from}: cannot read it: {e}; pass a regular file, or `-` to read stdin")),
        })?;
        let text = String::from_utf8(bytes).map_err(|_| not_text(&from))?;
        (from, text)
    } else {
        (String::new(), args.to_owned())
    };
    serde_json::from_str(&text).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Eof => "it ends early",
            serde_json::error::Category::Syntax => "a syntax error",
            serde_json::error::Category::Data | serde_json::error::Category::Io => "a value JSON cannot hold",
        };
        let from = if from.is_empty() { String::new() } else { format!(" {from}") };
        Usage(format!(
            "--args{from} is not JSON: {what} at line {}, column {} of its {} bytes (the text is not shown: it \
             may hold a secret); pass a JSON object, e.g. --args '{{\"k\":\"v\"}}'",
            e.line(),
            e.column(),
            text.len()
        ))
        .into()
    })
}

/// Print a step result; the exit code says which kind it was. Nothing
/// printed here (stdout or stderr) holds a ticket: the caller may be the model.
fn report(result: &StepResult, run: Option<&str>, as_json: bool) -> u8 {
    let (kind, code) = match result {
        StepResult::Output { .. } => ("output", exit::OUTPUT),
        StepResult::ToolError { .. } => ("tool_error", exit::TOOL_ERROR),
        StepResult::Blocked { .. } => ("blocked", exit::BLOCKED),
        StepResult::Awaiting { .. } => ("awaiting", exit::AWAITING),
        StepResult::Cancelled { .. } => ("cancelled", exit::CANCELLED),
    };
    if as_json {
        let mut v = json!({ "outcome": kind, "result": result.model_text() });
        if let StepResult::Output { content: toolgate::sandbox::executor::Content::Json(j), .. } = result {
            v["result"] = j.clone();
        }
        if let StepResult::Awaiting { correlation, expires_at, .. } = result {
            v["request"] = json!(correlation);
            v["expires_at"] = json!(expires_at);
        }
        if let Some(r) = run {
            v["run"] = json!(r);
        }
        match toolgate::display::json(&v) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("toolgate: cannot write the result as JSON: {e}"),
        }
    } else {
        match result {
            StepResult::Output { .. } => println!("{}", safe(&result.model_text())),
            StepResult::Awaiting { correlation, .. } => {
                println!("awaiting approval: request {}", field(correlation));
                eprintln!(
                    "hint: an approver lists it with `toolgate journal --awaiting` and decides with `toolgate approve` or \
                     `toolgate deny`; then make the same call with `--run {}` (or pass `--wait`)",
                    run.unwrap_or("RUN")
                );
            }
            StepResult::Blocked { reason, .. } => println!("blocked: {}", field(reason)),
            other => println!("{kind}: {}", safe(&other.model_text())),
        }
    }
    code
}

/// Text for a terminal that is printed over several lines of its own (an
/// error, a Tool's output): every character that would act on the terminal
/// or not be seen — controls, bidi and other format characters, separators
/// — shown escaped, by the one rule in [`toolgate::display`]; `\n` and `\t`
/// stay. A value placed on a line the host formats (an id, a description,
/// a path, a reason) is a [`field`] instead, so it cannot add a line of its
/// own that reads as the host's; an error that quotes a component's or a
/// server's text escapes it where it is made. `--json` output is exact
/// JSON, with the same characters escaped ([`json_text`]).
pub(crate) fn safe(s: &str) -> std::borrow::Cow<'_, str> {
    toolgate::display::escape_unseen(s, toolgate::display::Lines::Keep)
}

/// A `--json` view's line: compact JSON in which every character
/// [`safe`] would escape is a `\uXXXX` escape ([`toolgate::display::json`]),
/// so text from a Tool, the model or a client (a bidi override, a line
/// separator) reaches whoever reads it — an approver about to sign with
/// `--key`, perhaps without another view — escaped, and still parses back
/// to the same strings.
pub(crate) fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> Result<String> {
    toolgate::display::json(value).context("cannot write JSON")
}

/// One field of a line the host formats — what an approver reads
/// (`journal`, `approve`, `journal --awaiting`), a Tool's id and
/// description in `list` and `inspect`, a path or reason in a warning:
/// [`safe`], and line breaks and tabs escaped too, so the field cannot start
/// a line that reads as the host's (a description
/// `"Adds.\nmcp__github__delete_repo  Delete a repository"` would list a
/// second Tool).
pub(crate) fn field(s: &str) -> std::borrow::Cow<'_, str> {
    toolgate::display::escape_unseen(s, toolgate::display::Lines::Escape)
}

/// Write a file readable by its owner only (secret keys).
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options
        .open(path)
        .with_context(|| format!("cannot create {} (an existing key is never overwritten)", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

async fn pack(input: &Path, output: &Path) -> Result<u8> {
    // A regular file, bounded: a FIFO or `/dev/zero` is refused, not waited on or read without end.
    let bytes = toolgate::catalog::read_bounded(input)
        .map_err(|e| anyhow::anyhow!("{}: {e}; pack the built component file itself", input.display()))?;
    let (packed, tools) = toolgate_author::pack::pack(&bytes).await.with_context(|| input.display().to_string())?;
    std::fs::write(output, &packed).with_context(|| format!("cannot write {}", output.display()))?;
    eprintln!("packed {} tool(s) into {} ({})", tools.len(), output.display(), toolgate::Digest::of(&packed));
    for t in tools {
        println!("{}", t.id());
    }
    Ok(exit::OUTPUT)
}

/// The config at `path` — found the way every command finds it; read when
/// there, or when `required` — and the secret of every credential it
/// configures: what an author-side command writes into a component
/// (`what`) is checked against all of them, since a component's content is
/// what every model that sees its Tools reads. Without a config, or for a
/// secret that cannot be read, a warning says what is not checked.
fn configured_secrets(
    path: &Path,
    required: bool,
    what: &str,
) -> Result<(Option<Config>, toolgate_author::mcp_import::ConfiguredSecrets)> {
    use toolgate_author::mcp_import::ConfiguredSecrets;
    if !required && !path.exists() {
        tracing::warn!(
            "no config at {}: {what} are checked for no configured credential's secret (pass --config FILE)",
            field(&path.display().to_string())
        );
        return Ok((None, ConfiguredSecrets::none()));
    }
    let config = load_config(path)?;
    // Every secret the config names (the host's own too: serve tokens,
    // state key, PostgreSQL password), as the host's checks watch them.
    let watched = config.watched();
    let secrets = ConfiguredSecrets::read(watched.iter().map(|s| s.as_ref()));
    for (_, why) in secrets.unreadable() {
        tracing::warn!("{}; {what} are not checked for its secret", field(why));
    }
    Ok((Some(config), secrets))
}

async fn mcp_import(
    config: &Path,
    url: &str,
    credential: Option<&str>,
    name: Option<&str>,
    verify_every: u64,
    timeout: std::time::Duration,
    output: &Path,
) -> Result<u8> {
    use toolgate_author::mcp_import as mcp_adapter;
    // A URL or name that cannot be pinned is refused before anything is asked of the remote.
    mcp_adapter::endpoint(url)?;
    if let Some(n) = name {
        mcp_adapter::server_segment(n)?;
    }
    let (config, secrets) = configured_secrets(config, credential.is_some(), "the imported tool definitions")?;
    let spec = match (credential, &config) {
        (Some(c), Some(config)) => {
            let spec = config.credentials.get(c).cloned().ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: no `[credentials.{c}]`; define it to import with `--credential {c}`",
                    config.source.as_deref().unwrap_or(Path::new("config")).display()
                )
            })?;
            Some(spec)
        }
        _ => None,
    };
    let discovered = mcp_adapter::discover(url, spec.as_deref(), &secrets, timeout).await?;
    let mut pinned = mcp_adapter::pin(url, &discovered, name, credential)?;
    pinned.verify_every_secs = verify_every;
    let (packed, tools) = mcp_adapter::assemble(&pinned).await?;
    std::fs::write(output, &packed).with_context(|| format!("cannot write {}", output.display()))?;
    eprintln!("pinned {} tool(s) into {} ({})", tools.len(), output.display(), toolgate::Digest::of(&packed));
    if let Some(origin) = toolgate_sdk::mcp::origin(url) {
        eprintln!(
            "grant it with `hosts = [\"{origin}\"]`{} in a [[grants]] entry",
            match credential {
                Some(c) => format!(" and `credentials = [\"{c}\"]`"),
                None => String::new(),
            }
        );
    }
    for t in tools {
        println!("{}", t.id());
    }
    Ok(exit::OUTPUT)
}

fn inspect(file: &Path, as_json: bool) -> Result<u8> {
    let component = toolgate::catalog::load_file(file)
        .map_err(|reason| anyhow::anyhow!("{}: {}", file.display(), field(&reason)))?;
    if as_json {
        let tools: Vec<_> = component
            .tools
            .iter()
            .map(|t| {
                json!({
                    "descriptor": t.metadata.descriptor,
                    "capabilities": t.metadata.capabilities,
                })
            })
            .collect();
        let pinned = pinned_json(&component.pinned);
        println!(
            "{}",
            json_text(
                &json!({ "file": file, "digest": component.digest.to_string(), "tools": tools, "pinned": pinned })
            )?
        );
    } else {
        println!("{}  {}", field(&file.display().to_string()), component.digest);
        for t in &component.tools {
            let d = &t.metadata.descriptor;
            println!("  {}  {}", field(&d.id), field(&d.description));
            println!("    input schema: {}", field(&d.input_schema.to_string()));
            let c = &t.metadata.capabilities;
            if c.directories.is_empty() && c.hosts.is_empty() && c.credentials.is_empty() {
                println!("    capabilities: none");
            } else {
                println!("    capabilities: {}", field(&serde_json::to_string(c).unwrap_or_default()));
            }
        }
        // An adapter's pinned data (a Skill's content, an MCP adapter's pins):
        // what it serves and checks, readable for review.
        if !component.pinned.is_empty() {
            let text = serde_json::to_string_pretty(&pinned_json(&component.pinned)).unwrap_or_default();
            println!("  pinned data ({} bytes):", component.pinned.len());
            for line in text.lines() {
                println!("    {}", field(line));
            }
        }
    }
    Ok(exit::OUTPUT)
}

/// Pinned data as JSON (both adapters pin JSON); anything else as its size.
fn pinned_json(pinned: &[u8]) -> serde_json::Value {
    if pinned.is_empty() {
        return serde_json::Value::Null;
    }
    serde_json::from_slice(pinned).unwrap_or_else(|_| json!({ "bytes": pinned.len() }))
}

fn list(config: &Config, snapshot: &ExecutableAgentSnapshot, all: bool, as_json: bool) -> Result<u8> {
    // A fresh process has compiled nothing, so nothing is known to be unhealthy yet.
    let unhealthy = |_: &toolgate::Digest| None;
    if !all {
        let tools = snapshot.list(&unhealthy);
        if as_json {
            println!("{}", json_text(&tools)?);
        } else {
            for d in tools {
                println!("{}  {}", field(&d.id), field(&d.description));
            }
        }
        return Ok(exit::OUTPUT);
    }
    let listings = snapshot.list_all(&unhealthy);
    let refused = snapshot.catalog().refused();
    if as_json {
        let tools: Vec<_> = listings
            .iter()
            .map(|l| {
                json!({
                    "id": l.id,
                    "description": l.descriptor.as_ref().map(|d| &d.description),
                    "files": l.files,
                    "shown": l.removed.is_none(),
                    "reason": l.removed.as_ref().map(|r| r.to_string()),
                })
            })
            .collect();
        let refused: Vec<_> = refused.iter().map(|r| json!({ "file": r.path, "reason": r.reason })).collect();
        println!("{}", json_text(&json!({ "plugins": config.plugins, "tools": tools, "refused": refused }))?);
    } else {
        for l in &listings {
            match &l.removed {
                None => println!("shown    {}", field(&l.id)),
                Some(r) => println!("hidden   {}  ({})", field(&l.id), field(&r.to_string())),
            }
        }
        for r in refused {
            println!("refused  {}  ({})", field(&r.path.display().to_string()), field(&r.reason));
        }
    }
    Ok(exit::OUTPUT)
}

/// Every configured secret (each credential's, and the host's own: serve
/// tokens, state key, PostgreSQL password), read now to check what a listing
/// prints: the journal holds the arguments and results of calls, and its
/// listing may go to a public CI log. A field holding a secret is printed as
/// a note naming the credential, never the value.
pub(crate) struct Withhold {
    scanner: toolgate::sandbox::scan::SecretScanner,
}

impl Withhold {
    /// The secrets `config` names; one that cannot be read is said on stderr
    /// (what is printed is not checked for it).
    pub(crate) fn configured(config: &Config) -> Self {
        let mut values = Vec::new();
        for spec in config.watched() {
            match spec.read_to_check() {
                Ok(secret) => values.push((spec.name.clone(), secret.expose().to_vec())),
                Err(e) => eprintln!(
                    "toolgate: {}; what this listing prints is not checked for that secret",
                    field(&e.to_string())
                ),
            }
        }
        let scanner = toolgate::sandbox::scan::SecretScanner::new(&values);
        values.iter_mut().for_each(|(_, v)| v.fill(0));
        Withhold { scanner }
    }

    /// `text`, or — when it holds a configured secret in any form the
    /// host's scanner reads — a note naming the credential instead.
    pub(crate) fn text<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        match self.scanner.find(text.as_bytes()) {
            None => std::borrow::Cow::Borrowed(text),
            Some(found) => std::borrow::Cow::Owned(format!("[withheld: it holds {found}]")),
        }
    }

    /// `text`, a JSON document (a call's arguments), with each string and key
    /// that holds a configured secret replaced by the note of
    /// [`Withhold::text`], the rest as it was: an approver still reads what
    /// the call does (a destination, a command) when an agent puts a secret
    /// it knows (its own serve token) beside it. A secret the values hold
    /// only together, or text that is not JSON, withholds the whole.
    pub(crate) fn json_text<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        if self.scanner.find(text.as_bytes()).is_none() {
            return std::borrow::Cow::Borrowed(text);
        }
        let Ok(mut value) = serde_json::from_str::<serde_json::Value>(text) else { return self.text(text) };
        self.withhold_in(&mut value);
        let shown = value.to_string();
        match self.scanner.find(shown.as_bytes()) {
            None => std::borrow::Cow::Owned(shown),
            Some(_) => self.text(text),
        }
    }

    fn withhold_in(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::String(s) => {
                if let std::borrow::Cow::Owned(note) = self.text(s) {
                    *s = note;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.withhold_in(v)),
            Value::Object(members) => {
                let taken = std::mem::take(members);
                for (key, mut v) in taken {
                    self.withhold_in(&mut v);
                    members.insert(self.text(&key).into_owned(), v);
                }
            }
            _ => {}
        }
    }
}

async fn journal(store: &dyn StepStore, run: Option<&str>, secrets: &Withhold, as_json: bool) -> Result<u8> {
    for s in store.steps(run).await? {
        let s = withheld_step(s, secrets);
        let approved = s.approved_by.as_ref();
        if as_json {
            let captured = serde_json::from_str::<serde_json::Value>(&s.captured)
                .unwrap_or_else(|_| if s.captured.is_empty() { serde_json::Value::Null } else { json!(s.captured) });
            println!(
                "{}",
                json_text(&json!({
                    "seq": s.seq, "run": s.run_id, "call": s.call_id, "tool": s.tool_id,
                    "arguments": s.arguments, "verdict": s.verdict, "outcome": s.outcome.as_str(),
                    "result": s.result, "captured": captured,
                    "approved_by": approved.map(|a| json!({ "principal": a.principal, "channel": a.channel, "at": a.at })),
                }))?
            );
        } else {
            println!("{}", journal_line(&s));
        }
    }
    Ok(exit::OUTPUT)
}

/// `s` with every text field that holds a configured secret replaced by a
/// note naming the credential.
fn withheld_step(mut s: toolgate::store::StepRecord, secrets: &Withhold) -> toolgate::store::StepRecord {
    if let std::borrow::Cow::Owned(shown) = secrets.json_text(&s.arguments) {
        s.arguments = shown;
    }
    let check = |t: &mut String| {
        if let std::borrow::Cow::Owned(note) = secrets.text(t) {
            *t = note;
        }
    };
    for t in [&mut s.run_id, &mut s.call_id, &mut s.tool_id, &mut s.verdict, &mut s.result, &mut s.captured] {
        check(t);
    }
    if let Some(a) = s.approved_by.as_mut() {
        check(&mut a.principal);
        check(&mut a.channel);
    }
    s
}

/// One step as text. Who approved comes before the Tool's result, and the
/// result is quoted (its quotes and backslashes escaped): nothing a result
/// holds can look like the host's own words after or around it.
fn journal_line(s: &toolgate::store::StepRecord) -> String {
    let approved = s
        .approved_by
        .as_ref()
        .map(|a| format!("approved by {} via {}: ", field(&a.principal), field(&a.channel)))
        .unwrap_or_default();
    format!(
        "#{:<4} {} {} {} → {} [{}] {approved}{}",
        s.seq,
        field(&s.run_id),
        field(&s.tool_id),
        field(&s.arguments),
        s.outcome.as_str(),
        field(&s.verdict),
        toolgate::display::quoted(&s.result, 120)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgate::store::{ApprovedBy, OutcomeKind, StepRecord};

    fn step(result: &str, approved_by: Option<ApprovedBy>) -> StepRecord {
        StepRecord {
            seq: 7,
            run_id: "run-1".into(),
            call_id: "call-1".into(),
            tool_id: "notes".into(),
            arguments: "{}".into(),
            verdict: "ask".into(),
            outcome: OutcomeKind::Output,
            result: result.into(),
            captured: String::new(),
            ticket_id: None,
            structured: false,
            approved_by,
        }
    }

    /// A Tool's result cannot pass for the host's note of who approved the
    /// step, nor reorder the line with a bidi control.
    #[test]
    fn a_journal_line_keeps_the_result_apart_from_the_approval() {
        let forged = "done\u{202E}  (approved by alice via signature)";
        let line = journal_line(&step(forged, None));
        assert!(!line.contains('\u{202E}') && line.contains("\\u{202e}"), "{line}");
        assert!(line.ends_with("[ask] \"done\\u{202e}  (approved by alice via signature)\""), "{line}");

        let alice = ApprovedBy { principal: "alice".into(), channel: "signature".into(), at: 0 };
        let line = journal_line(&step("\"ok\"  (approved by mallory via terminal)", Some(alice)));
        assert!(
            line.ends_with(r#"[ask] approved by alice via signature: "\"ok\"  (approved by mallory via terminal)""#),
            "the approval first, the result quoted after it: {line}"
        );
    }

    /// What `safe` and `field` keep and escape is the library's one rule
    /// (`toolgate::display`, tested there); here only the split between them.
    #[test]
    fn safe_keeps_lines_and_field_keeps_one() {
        assert!(matches!(safe("plain text\nnext\tcol"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(safe("a\u{1b}[2Jb\u{202E}"), "a\\u{1b}[2Jb\\u{202e}");
        assert_eq!(field("a\nb\u{2028}c"), "a\\nb\\u{2028}c");
    }
}
