//! The approver's side of the CLI: `approve`, `deny` and `journal --awaiting`.
//!
//! Owns turning a human's decision into an [`Approval`] the core verifies:
//! with `[approval] keys` configured, a decision is signed with `--key FILE`
//! (a key the agent's OS user should not be able to read); without keys, it
//! must be typed on an interactive terminal after the exact call is shown.
//! With neither, nothing is decided. Either way the decision names the record
//! shown (signed over its digest, or carrying it), so a record rewritten
//! while the human reads is not approved. Tickets are listed only to an approver.
//!
//! Architecture invariant: nothing here prints a ticket where the model or
//! an agent's shell can read it without being an approver, and a refused
//! decision leaves the ticket pending.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::Path;

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use toolgate::approval::{self, Decision};
use toolgate::keys::SecretKey;
use toolgate::store::{AwaitingRecord, TicketError};
use toolgate::{Approval, Config, Runtime, StepResult};

use crate::{field, json_text};

/// Whether this process talks to a human on an interactive terminal.
fn on_terminal() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// The OS user running this process, as the journal records a terminal approver.
fn os_user() -> String {
    let name = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into());
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        if let Ok(m) = std::fs::metadata("/proc/self") {
            return format!("{name} (uid {})", m.uid());
        }
    }
    name
}

fn read_key(path: &Path) -> Result<SecretKey> {
    let text = toolgate::files::read_text(path, 4096)
        .with_context(|| format!("cannot read approver key {}", path.display()))?;
    SecretKey::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn when(unix: i64) -> String {
    if unix <= 0 { "unknown".to_owned() } else { format!("unix time {unix}") }
}

/// The exact call, as an approver must see it before deciding.
fn show(r: &AwaitingRecord) {
    eprintln!("request {} asks to run:", field(&r.call_id));
    eprintln!("  tool       {}", field(&r.tool_id));
    eprintln!("  arguments  {}", field(&r.arguments));
    eprintln!("  component  {}", r.component_digest);
    eprintln!("  asked by   agent `{}` in run {}", field(&r.agent), field(&r.run_id));
    eprintln!("  asked at   {}; expires at {}", when(r.requested_at), when(r.expires_at));
}

/// Decide `ticket` as the human running this command; returns the result
/// the runtime committed.
pub async fn decide(
    config: &Config,
    runtime: &Runtime,
    ticket: &str,
    key: Option<&Path>,
    decision: Decision,
) -> Result<StepResult> {
    let record = runtime.store().awaiting(ticket).await?.ok_or_else(|| TicketError::Unknown(ticket.to_owned()))?;
    if record.state != "pending" {
        return Err(TicketError::Used(ticket.to_owned()).into());
    }
    show(&record);
    let approval = match key {
        Some(path) => {
            let key = read_key(path)?;
            Approval::signed(approval::sign(&key, &record, &decision))
        }
        None if !config.approvers.is_empty() => {
            bail!(
                "`[approval] keys` are configured, so a decision must be signed: pass `--key FILE` with an approver key"
            )
        }
        None if !on_terminal() => bail!(
            "deciding a ticket needs an approver, and this is not an interactive terminal; configure \
             `[approval] keys` (from `toolgate keygen --for approval`) and pass `--key FILE`, or run this on a terminal"
        ),
        None => {
            let word = match decision {
                Decision::Approve => "approve",
                Decision::Deny { .. } => "deny",
            };
            eprint!("type `{word}` to {word} this call: ");
            let _ = std::io::stderr().flush();
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).context("cannot read the confirmation")?;
            if line.trim() != word {
                bail!("not confirmed; nothing was decided and the request is still pending");
            }
            // The human decided on the record shown above: a journal writer
            // that rewrites it while they read gets the approval refused.
            Approval::on_terminal(os_user(), record.call_digest())
        }
    };
    let result = match &decision {
        Decision::Approve => runtime.approve(ticket, &approval).await?,
        Decision::Deny { reason } => runtime.deny(ticket, reason, &approval).await?,
    };
    Ok(result)
}

/// `journal --awaiting`: pending requests; their tickets only to an approver
/// (a key listed in `[approval] keys`, or a terminal when none are configured).
pub async fn list_pending(config: &Config, runtime: &Runtime, key: Option<&Path>, as_json: bool) -> Result<()> {
    let approver = match key {
        Some(path) => {
            let public = read_key(path)?.public();
            if !config.approvers.contains(&public) {
                bail!("{} is not an approver key: its public key {public} is not in `[approval] keys`", path.display());
            }
            true
        }
        None => config.approvers.is_empty() && on_terminal(),
    };
    let pending = runtime.store().pending().await?;
    for a in &pending {
        let ticket = approver.then_some(a.ticket_id.as_str());
        if as_json {
            let mut v = json!({
                "request": a.call_id, "run": a.run_id, "agent": a.agent, "tool": a.tool_id,
                "arguments": a.arguments, "component": a.component_digest.to_string(),
                "requested_at": a.requested_at, "expires_at": a.expires_at,
            });
            if let Some(t) = ticket {
                v["ticket"] = json!(t);
            }
            println!("{}", json_text(&v)?);
        } else {
            println!(
                "{}  {} {}  (agent {}, run {}){}",
                field(&a.call_id),
                field(&a.tool_id),
                field(&a.arguments),
                field(&a.agent),
                field(&a.run_id),
                ticket.map(|t| format!("  ticket {t}")).unwrap_or_default()
            );
        }
    }
    if !approver && !pending.is_empty() {
        eprintln!(
            "toolgate: tickets are shown to approvers only: pass `--key FILE` (a key in `[approval] keys`){}",
            if config.approvers.is_empty() { ", or run this on a terminal" } else { "" }
        );
    }
    Ok(())
}
